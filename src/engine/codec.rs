//! Binary form of an [`EngineSample`] for proxy-wasm shared data.
//!
//! Layout (little-endian): `VERSION` u8, flags u8 (bit 0 waiting, 1 running,
//! 2 kv_usage, 3 max_lora), then the present numbers in that order (f64, f64,
//! f64, u32), then two adapter lists (running, waiting), each a u8 count and
//! per name a u16 length and its UTF-8 bytes. A parsed sample with no LoRA
//! info takes 2–28 bytes. Decoding is strict and O(input).

use super::{EngineSample, MAX_ADAPTERS, MAX_ADAPTER_NAME};

const VERSION: u8 = 1;
const WAITING: u8 = 1;
const RUNNING: u8 = 2;
const KV: u8 = 4;
const MAX_LORA: u8 = 8;

fn valid(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite() && *v >= 0.0)
}

pub(super) fn encode(s: &EngineSample) -> Vec<u8> {
    let nums = [
        (WAITING, valid(s.waiting)),
        (RUNNING, valid(s.running)),
        (KV, valid(s.kv_usage)),
    ];
    let mut flags = 0;
    let mut out = vec![VERSION, 0];
    for (bit, v) in nums {
        if let Some(v) = v {
            flags |= bit;
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    if let Some(m) = s.max_lora {
        flags |= MAX_LORA;
        out.extend_from_slice(&m.to_le_bytes());
    }
    if let Some(f) = out.get_mut(1) {
        *f = flags;
    }
    for list in [&s.loras_running, &s.loras_waiting] {
        let names: Vec<&String> = list
            .iter()
            .filter(|n| n.len() <= MAX_ADAPTER_NAME)
            .take(MAX_ADAPTERS)
            .collect();
        out.push(names.len() as u8);
        for n in names {
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(n.as_bytes());
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn f64(&mut self) -> Option<f64> {
        let v = f64::from_le_bytes(self.array()?);
        (v.is_finite() && v >= 0.0).then_some(v)
    }
    fn list(&mut self) -> Option<Vec<String>> {
        let n = usize::from(self.u8()?);
        if n > MAX_ADAPTERS {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = usize::from(u16::from_le_bytes(self.array()?));
            if len > MAX_ADAPTER_NAME {
                return None;
            }
            out.push(String::from_utf8(self.take(len)?.to_vec()).ok()?);
        }
        Some(out)
    }
}

pub(super) fn decode(b: &[u8]) -> Option<EngineSample> {
    let mut r = Reader(b);
    if r.u8()? != VERSION {
        return None;
    }
    let flags = r.u8()?;
    if flags & !(WAITING | RUNNING | KV | MAX_LORA) != 0 {
        return None;
    }
    let mut num = |bit: u8| -> Option<Option<f64>> {
        if flags & bit == 0 {
            Some(None)
        } else {
            r.f64().map(Some)
        }
    };
    let waiting = num(WAITING)?;
    let running = num(RUNNING)?;
    let kv_usage = num(KV)?;
    let max_lora = if flags & MAX_LORA == 0 {
        None
    } else {
        Some(u32::from_le_bytes(r.array()?))
    };
    let loras_running = r.list()?;
    let loras_waiting = r.list()?;
    if !r.0.is_empty() {
        return None;
    }
    Some(EngineSample {
        waiting,
        running,
        kv_usage,
        loras_running,
        loras_waiting,
        max_lora,
    })
}
