//! Lookups in a serialised header map, the form `proxy_get_header_map_pairs`
//! returns (proxy-wasm ABI 0.2.1): `u32` count, then per pair `u32` key size
//! and `u32` value size (little endian), then per pair the key, a NUL, the
//! value, a NUL.
//!
//! One host call fetches the whole map; the filter then reads the few
//! headers it needs from it (request: `upgrade`, `:method`, `:path`;
//! response: `:status`, `content-type`) instead of one host call (and one VM
//! allocation) per header. Cost: O(bytes of the map) per lookup, no
//! allocation. A malformed map reads as empty (every lookup `None`).

fn u32_at(b: &[u8], at: usize) -> Option<usize> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(<[u8; 4]>::try_from(s).ok()?) as usize)
}

/// The value of the first header named `name` (ASCII case-insensitive).
pub fn value<'a>(map: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let n = u32_at(map, 0)?;
    let mut data = n.checked_mul(8)?.checked_add(4)?;
    for i in 0..n {
        let k = u32_at(map, 4 + 8 * i)?;
        let v = u32_at(map, 8 + 8 * i)?;
        let key = map.get(data..data.checked_add(k)?)?;
        let vstart = data + k + 1;
        let val = map.get(vstart..vstart.checked_add(v)?)?;
        if key.eq_ignore_ascii_case(name) {
            return Some(val);
        }
        data = vstart + v + 1;
    }
    None
}

/// Serialise `pairs` in the host's form (tests, benchmarks).
pub fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn finds_values_case_insensitively_first_wins() {
        let m = encode(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("Upgrade", ""),
            ("x-a", "1"),
            ("x-a", "2"),
        ]);
        assert_eq!(value(&m, b":method"), Some(&b"POST"[..]));
        assert_eq!(value(&m, b":path"), Some(&b"/v1/chat/completions"[..]));
        assert_eq!(value(&m, b"upgrade"), Some(&b""[..]));
        assert_eq!(value(&m, b"x-a"), Some(&b"1"[..]));
        assert_eq!(value(&m, b"content-type"), None);
        assert_eq!(value(&encode(&[]), b":path"), None);
    }

    #[test]
    fn malformed_maps_read_as_empty() {
        let m = encode(&[(":status", "200"), ("content-type", "application/json")]);
        for cut in 0..m.len() {
            // Truncated anywhere: never a panic, never a value past the cut.
            if let Some(v) = value(&m[..cut], b"content-type") {
                assert_eq!(v, b"application/json");
            }
        }
        let mut huge = m.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(value(&huge, b":status"), None);
        assert_eq!(value(&[], b":status"), None);
    }
}
