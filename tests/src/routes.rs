//! The routes the HTTP layer declares, read from its source: what the template and the
//! contract's operation list are held to.

use std::collections::BTreeSet;

/// The `.rs` files under `dir`, its subdirectories' too.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `METHOD path` of every route the HTTP layer's routers declare (`.route("path",
/// method(handler))` in `shared/api/src` and its modules' directories).
pub fn code_routes() -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/api/src");
    let mut files = Vec::new();
    sources(&dir, &mut files);
    let mut routes = BTreeSet::new();
    let mut files = Vec::new();
    sources(&dir, &mut files);
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (at, _) in text.match_indices(".route(") {
            let rest = text[at + ".route(".len()..].trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            let path = &rest[..rest.find('"').unwrap()];
            let after = rest[path.len() + 1..]
                .trim_start()
                .trim_start_matches(',')
                .trim_start();
            let call = after.trim_start_matches("axum::routing::");
            let method = &call[..call.find('(').unwrap_or(0)];
            assert!(
                ["get", "post", "put", "patch", "delete"].contains(&method),
                "route {path}: a method router other than one method ({method:?}) is not read here"
            );
            routes.insert(format!("{} {path}", method.to_ascii_uppercase()));
        }
    }
    routes
}
