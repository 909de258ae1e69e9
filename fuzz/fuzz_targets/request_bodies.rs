//! Every request body the POST routes read, as bytes, read the way the routes read them
//! (`JsonBody::value`: blank is `null`, else JSON text to a `Value`; then the route's
//! type from that `Value`): never a panic; what parses serializes, and
//! - as a `Value` (`to_value`), reads back to the same body, exactly;
//! - as JSON text, reads back (the same way) to the same body, numbers that are floats
//!   aside: serde_json reads float text to the nearest double only on a best-effort
//!   basis (its `float_roundtrip` feature is off), so a float may come back a few ULPs
//!   away (`MAX_ULPS`). Every other scalar, every key, every string comes back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use tollgate_protocol::{approvals, execution, runs};

/// The bytes as `JsonBody::value` reads them.
fn body_value(data: &[u8]) -> Option<Value> {
    if data.iter().all(u8::is_ascii_whitespace) {
        return Some(Value::Null);
    }
    serde_json::from_slice(data).ok()
}

/// How far (in units in the last place) serde_json may read back a float it wrote: 2
/// at most over millions of random doubles, subnormals and huge ones included.
const MAX_ULPS: u64 = 4;

/// `x`'s bits as an integer that orders as the doubles do (adjacent doubles are 1 apart).
fn ordered(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    if bits < 0 {
        i64::MIN - bits
    } else {
        bits
    }
}

/// Whether `a` and `b` are the same JSON, floats compared to within [`MAX_ULPS`],
/// everything else exactly (object keys in any order).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() && y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || ordered(x).abs_diff(ordered(y)) <= MAX_ULPS
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// `null_is_empty`: the route reads an absent body as `{}` (`POST /api/runs`).
fn roundtrip<T>(data: &[u8], null_is_empty: bool)
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    let read = |value: Value| -> Result<T, serde_json::Error> {
        match value {
            Value::Null if null_is_empty => {
                serde_json::from_value(Value::Object(Default::default()))
            }
            other => serde_json::from_value(other),
        }
    };
    let Some(value) = body_value(data) else {
        return;
    };
    let Ok(body) = read(value) else {
        return;
    };
    let as_value = serde_json::to_value(&body).expect("a parsed body serializes to a Value");
    let back: T = serde_json::from_value(as_value.clone()).expect("its Value reads back");
    assert_eq!(back, body, "Value round trip");

    let text = serde_json::to_vec(&body).expect("a parsed body serializes");
    let again = body_value(&text).expect("what serialized is JSON");
    let back: T = read(again).expect("what serialized reads back");
    let back_value = serde_json::to_value(&back).unwrap();
    assert!(
        same(&back_value, &as_value),
        "text round trip: {as_value} became {back_value}"
    );
    // Whatever has no float in it comes back exactly.
    if !has_float(&as_value) {
        assert_eq!(back, body, "text round trip");
    }
}

fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    roundtrip::<runs::CreateRun>(data, true);
    roundtrip::<runs::AppendEvents>(data, false);
    roundtrip::<approvals::ArmApproval>(data, false);
    roundtrip::<approvals::Decide>(data, false);
    roundtrip::<execution::Start>(data, false);
    roundtrip::<execution::Settle>(data, false);
    roundtrip::<execution::Reconcile>(data, false);
});
