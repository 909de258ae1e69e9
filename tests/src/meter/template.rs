//! What the deployment template (`infra/template.yaml`) says a function is billed by:
//! its `MemorySize` (the function's own, else the `Globals`' one), so the meter prices
//! what is deployed.

use serde_yaml_ng::Value;

/// The template's logical id of a function (`ingress` → `IngressFunction`).
fn logical_id(function: &str) -> String {
    let mut id = String::new();
    for part in function.split('-') {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            id.push(first.to_ascii_uppercase());
            id.push_str(chars.as_str());
        }
    }
    match id.as_str() {
        "Websocket" => "WebSocketFunction".into(),
        _ => id + "Function",
    }
}

fn memory_of(value: Option<&Value>) -> Option<u32> {
    value
        .and_then(|m| m.get("MemorySize"))
        .and_then(Value::as_u64)
        .map(|m| m as u32)
}

/// `MemorySize` (MB) of `function` (`ingress`, `websocket`, `fanout`, …) in `template`.
pub fn memory_mb_in(template: &str, function: &str) -> u32 {
    let doc: Value = serde_yaml_ng::from_str(template).expect("the template parses");
    let id = logical_id(function);
    let resource = doc
        .get("Resources")
        .and_then(|r| r.get(id.as_str()))
        .unwrap_or_else(|| panic!("the template has no {id}"));
    memory_of(resource.get("Properties"))
        .or_else(|| memory_of(doc.get("Globals").and_then(|g| g.get("Function"))))
        .unwrap_or(128)
}

/// `MemorySize` (MB) of `function` in `infra/template.yaml`.
pub fn memory_mb(function: &str) -> u32 {
    memory_mb_in(tollgate_store::schema::TEMPLATE, function)
}

/// The largest `MemorySize` among `functions` (an upper bound when they differ).
pub fn max_memory_mb(functions: &[&str]) -> u32 {
    functions.iter().map(|f| memory_mb(f)).max().unwrap_or(128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_functions_own_memory_size_wins_over_the_globals() {
        let template = "Globals:\n  Function:\n    MemorySize: 256\nResources:\n  \
                        IngressFunction:\n    Properties:\n      MemorySize: 128\n  \
                        WebSocketFunction:\n    Properties: {}\n";
        assert_eq!(memory_mb_in(template, "ingress"), 128);
        assert_eq!(memory_mb_in(template, "websocket"), 256);
    }

    #[test]
    fn every_priced_function_is_in_the_template() {
        for f in [
            "ingress",
            "approvals",
            "settlement",
            "timers",
            "replay",
            "replay-stream",
            "websocket",
            "fanout",
        ] {
            assert!(memory_mb(f) >= 128, "{f}");
        }
    }
}
