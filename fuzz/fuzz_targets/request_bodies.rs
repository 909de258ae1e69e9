//! Every request body the POST routes read, as bytes: parsing never panics, and what
//! parses serializes again and parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use tollgate_protocol::{approvals, execution, runs};

fn roundtrip<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(v) = serde_json::from_slice::<T>(data) {
        let again = serde_json::to_vec(&v).expect("a parsed body serializes");
        let back: T = serde_json::from_slice(&again).expect("what serialized parses");
        assert_eq!(back, v);
    }
}

fuzz_target!(|data: &[u8]| {
    roundtrip::<runs::CreateRun>(data);
    roundtrip::<runs::AppendEvents>(data);
    roundtrip::<approvals::ArmApproval>(data);
    roundtrip::<approvals::Decide>(data);
    roundtrip::<execution::Start>(data);
    roundtrip::<execution::Settle>(data);
    roundtrip::<execution::Reconcile>(data);
});
