//! OURS (placeholder while the core module is written).

use prefix_router::{Loads, Router};

use super::{Policy, Routed, View};
use crate::engine::SimRequest;
use crate::model::ModelParams;

/// Parameters of our policy.
#[derive(Debug, Clone)]
pub struct OursParams {
    /// Characters hashed.
    pub prefix_length: usize,
    /// Ring points per endpoint.
    pub virtual_nodes: u32,
}

impl Default for OursParams {
    fn default() -> Self {
        OursParams {
            prefix_length: 65536,
            virtual_nodes: 256,
        }
    }
}

impl OursParams {
    /// Set one parameter by name.
    pub fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let bad = || format!("--ours {k}: bad value {v}");
        match k {
            "prefix_length" => self.prefix_length = v.parse().map_err(|_| bad())?,
            "virtual_nodes" => self.virtual_nodes = v.parse().map_err(|_| bad())?,
            _ => return Err(format!("--ours: unknown parameter {k}")),
        }
        Ok(())
    }
}

/// Our policy.
pub struct Ours {
    router: Router,
    key: usize,
}

impl Ours {
    /// Build.
    pub fn new(
        router: Router,
        key: usize,
        _p: OursParams,
        _m: &ModelParams,
    ) -> Result<Ours, String> {
        Ok(Ours { router, key })
    }
}

impl Policy for Ours {
    fn route(&mut self, _idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let d = self
            .router
            .select(&req.keys.core[self.key], Loads::new(view.in_flight), 0);
        Routed {
            replica: d.primary,
            spill: false,
        }
    }
}
