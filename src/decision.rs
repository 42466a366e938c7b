//! The outcome of one routing decision and its reason.
//!
//! [`Branch`] names why a replica was chosen; its [`Branch::as_str`] label is
//! the single source of the stat names (`prefix_router.branch.<label>`) and of
//! the decision header value, so tests, stats and logs agree.

/// Why the primary replica was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Branch {
    /// The ring owner of the key was accepted, or (`affinity`) a replica known
    /// to hold the prefix (cache hit expected).
    Hit,
    /// The ring owner was over its bound; the next acceptable replica on the
    /// ring. `affinity`: the holders were too busy for the prefix's worth; a
    /// new holder (hot prefixes grow this way).
    Spill,
    /// Every replica was over its bound; the least loaded one.
    LeastLoaded,
    /// `affinity`: nothing known about this prefix; ring placement by load.
    Cold,
    /// No key (no body, empty prompt, session without id): least request.
    NoKey,
    /// The body claimed JSON but did not parse: least request.
    BadInput,
    /// `random` strategy.
    Random,
    /// `round_robin` strategy.
    RoundRobin,
    /// `least_request` strategy.
    LeastRequest,
}

impl Branch {
    /// Every branch, for stat registration.
    pub const ALL: [Branch; 9] = [
        Branch::Hit,
        Branch::Spill,
        Branch::LeastLoaded,
        Branch::Cold,
        Branch::NoKey,
        Branch::BadInput,
        Branch::Random,
        Branch::RoundRobin,
        Branch::LeastRequest,
    ];

    /// Label for stats and the decision header.
    pub const fn as_str(self) -> &'static str {
        match self {
            Branch::Hit => "hit",
            Branch::Spill => "spill",
            Branch::LeastLoaded => "least_loaded",
            Branch::Cold => "cold",
            Branch::NoKey => "no_key",
            Branch::BadInput => "bad_input",
            Branch::Random => "random",
            Branch::RoundRobin => "round_robin",
            Branch::LeastRequest => "least_request",
        }
    }
}

/// Where the routing key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeySource {
    /// Chat completions message text.
    Chat,
    /// Completions prompt.
    Completions,
    /// Responses instructions + input.
    Responses,
    /// Raw body bytes.
    Raw,
    /// Body above `max_body_bytes`: its first raw bytes.
    Oversize,
    /// The routing id alone (`session` strategy).
    RoutingId,
    /// No key.
    None,
    /// Malformed JSON.
    Malformed,
}

impl KeySource {
    /// Every source, for stat registration.
    pub const ALL: [KeySource; 8] = [
        KeySource::Chat,
        KeySource::Completions,
        KeySource::Responses,
        KeySource::Raw,
        KeySource::Oversize,
        KeySource::RoutingId,
        KeySource::None,
        KeySource::Malformed,
    ];

    /// Label for stats and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            KeySource::Chat => "chat",
            KeySource::Completions => "completions",
            KeySource::Responses => "responses",
            KeySource::Raw => "raw",
            KeySource::Oversize => "oversize",
            KeySource::RoutingId => "routing_id",
            KeySource::None => "none",
            KeySource::Malformed => "malformed",
        }
    }
}

/// A routing decision: endpoint indices into [`crate::Config::endpoints`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The replica to use.
    pub primary: usize,
    /// The replica to retry on (ring successor), if there is another one.
    pub secondary: Option<usize>,
    /// Why `primary` was chosen.
    pub branch: Branch,
}
