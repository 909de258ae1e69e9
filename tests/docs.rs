//! The repository explains itself truthfully: every `docs/architecture.md §N` the code
//! cites is a section of that page, and every repository path the page names exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The files git would check out, below `dir` (no `target/`, no caches).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            sources(&path, out);
        } else if ["rs", "js", "sh", "yaml", "toml", "html", "md", "py", "ts"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
            || name == "Makefile"
        {
            out.push(path);
        }
    }
}

/// The `§N` section numbers the architecture page has (`## §N …` headings).
fn sections(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("## §"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_cited_section_of_the_architecture_page_exists() {
    let root = root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let have = sections(&page);
    assert!(have.len() >= 8, "{have:?}");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut cited = 0;
    let mut missing = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (i, _) in text.match_indices("architecture.md §") {
            let rest = &text[i + "architecture.md §".len()..];
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            // `§N` as a placeholder (this file, the page's own preamble) cites nothing.
            if n.is_empty() {
                continue;
            }
            cited += 1;
            if !have.contains(&n) {
                missing.push(format!("{}: §{n}", file.display()));
            }
        }
    }
    assert!(
        cited >= 20,
        "the code cites the page ({cited} references found)"
    );
    assert!(
        missing.is_empty(),
        "cited sections that do not exist: {missing:#?}"
    );
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let root = root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    let mut named = 0;
    for span in page.split('`').skip(1).step_by(2) {
        let first = span.split_whitespace().next().unwrap_or_default();
        // `functions/<name>/…` is a pattern, not a path.
        if first.contains('<') {
            continue;
        }
        if ![
            "shared/",
            "functions/",
            "cli/",
            "tests/",
            "infra/",
            "fixtures/",
            "docs/",
        ]
        .iter()
        .any(|p| first.starts_with(p))
        {
            continue;
        }
        // `dir/{a,b}.rs` names several files.
        let paths: Vec<String> = match (first.find('{'), first.find('}')) {
            (Some(open), Some(close)) if open < close => first[open + 1..close]
                .split(',')
                .map(|alt| format!("{}{alt}{}", &first[..open], &first[close + 1..]))
                .collect(),
            _ => vec![first.trim_end_matches([',', '.', ':', ')']).to_owned()],
        };
        for path in paths {
            named += 1;
            if !root.join(&path).exists() {
                missing.push(path);
            }
        }
    }
    assert!(named >= 20, "the page names the code ({named} paths found)");
    assert!(
        missing.is_empty(),
        "paths the page names that do not exist: {missing:#?}"
    );
}

#[test]
fn a_missing_section_is_caught() {
    let page = "# x\n## §1 The one rule\n## §2 Flow\n";
    assert_eq!(sections(page), vec!["1", "2"]);
    assert!(!sections(page).contains(&"3".to_owned()));
}
