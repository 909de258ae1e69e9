//! `make chaos`: the randomized workload over several `tollgate serve` processes, with
//! DynamoDB, SQS and each serve process behind fault proxies, DynamoDB Local killed and
//! restarted on its on-disk database, LocalStack killed and restarted, a serve process
//! killed mid-request; then the history checker. Prints one line per seed (operations,
//! unknown outcomes, faults by kind, crashes, violations) and exits non-zero on any
//! violation, or when a fault kind or crash it was configured to inject never happened.
//!
//! Starts its own DynamoDB Local and LocalStack from the cache dir (`$TOLLGATE_CACHE`,
//! where `tests/harness/emulators.sh install` puts them); without them it uses the
//! endpoints in `AWS_ENDPOINT_URL_DYNAMODB` / `AWS_ENDPOINT_URL_SQS` and crashes neither.
//!
//!   tollgate-chaos [--seeds N] [--first-seed S] [--ops N] [--serves N] [--workers N]
//!                  [--fault-rate P] [--seed-seconds S] [--total-seconds S]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_tests::chaos::checker::{
    check, lost_in_storage_kills, Invariant, Violation, KILL_WINDOW_MS,
};
use tollgate_tests::chaos::dynamodb::{jar_dir, DynamoDbLocal};
use tollgate_tests::chaos::localstack::{self, LocalStack};
use tollgate_tests::chaos::proxy::{Fault, FaultCounts};
use tollgate_tests::chaos::workload::{Chaos, Config};

struct Args {
    seeds: u64,
    first_seed: u64,
    ops: usize,
    serves: usize,
    workers: usize,
    fault_rate: f64,
    seed_seconds: u64,
    total_seconds: u64,
}

fn args() -> Args {
    let mut a = Args {
        seeds: 20,
        first_seed: 1,
        ops: 500,
        serves: 2,
        workers: 16,
        fault_rate: 0.1,
        seed_seconds: 60,
        total_seconds: 600,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        let bad = || -> ! {
            eprintln!("tollgate-chaos: bad value {value:?} for {}", argv[i]);
            std::process::exit(2)
        };
        match argv[i].as_str() {
            "--seeds" => a.seeds = value.parse().unwrap_or_else(|_| bad()),
            "--first-seed" => a.first_seed = value.parse().unwrap_or_else(|_| bad()),
            "--ops" => a.ops = value.parse().unwrap_or_else(|_| bad()),
            "--serves" => a.serves = value.parse().unwrap_or_else(|_| bad()),
            "--workers" => a.workers = value.parse().unwrap_or_else(|_| bad()),
            "--fault-rate" => a.fault_rate = value.parse().unwrap_or_else(|_| bad()),
            "--seed-seconds" => a.seed_seconds = value.parse().unwrap_or_else(|_| bad()),
            "--total-seconds" => a.total_seconds = value.parse().unwrap_or_else(|_| bad()),
            other => {
                eprintln!("tollgate-chaos: unknown argument {other}");
                std::process::exit(2)
            }
        }
        i += 2;
    }
    a
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let a = args();
    let began = Instant::now();
    let total = Duration::from_secs(a.total_seconds);
    let db_dir = std::env::temp_dir().join(format!("tollgate-chaos-ddb-{}", std::process::id()));
    let dynamodb = match jar_dir() {
        Some(dir) => Some(DynamoDbLocal::start(&dir, &db_dir).await),
        None => {
            eprintln!("chaos: DynamoDB Local is not in the cache dir; using AWS_ENDPOINT_URL_DYNAMODB without crashing it");
            None
        }
    };
    let own_dynamodb = dynamodb.is_some();
    let cache = std::env::var_os("TOLLGATE_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache"));
    let ls_dir = std::env::temp_dir().join(format!("tollgate-chaos-ls-{}", std::process::id()));
    let localstack = if localstack::installed(&cache) {
        Some(LocalStack::start(&cache, &ls_dir).await)
    } else {
        eprintln!("chaos: LocalStack is not in the cache dir; using AWS_ENDPOINT_URL_SQS without restarting it");
        None
    };
    let own_localstack = localstack.is_some();
    let chaos = Arc::new(Chaos::start(a.serves, dynamodb, localstack).await);
    println!(
        "chaos: {} seeds from {} x {} operations, {} serve processes, {} workers, fault rate {}",
        a.seeds, a.first_seed, a.ops, a.serves, a.workers, a.fault_rate
    );
    let kinds: Vec<Fault> = Fault::ALL.to_vec();
    let mut header = format!(
        "{:>6} {:>5} {:>6} {:>7} {:>6}",
        "seed", "ops", "failed", "unknown", "secs"
    );
    for k in &kinds {
        header.push_str(&format!(" {:>w$}", k.name(), w = k.name().len().max(4)));
    }
    header.push_str(" ddb_kill ls_kill serve_kill ddb_lost violations");
    println!("{header}");
    let mut totals = FaultCounts::default();
    let (mut all_ops, mut all_failed, mut all_unknown) = (0, 0, 0);
    let (mut ran, mut crashes, mut ls_crashes, mut kills, mut all_lost) = (0, 0, 0, 0, 0);
    let mut violations: Vec<(u64, Violation)> = Vec::new();
    let mut by_invariant = std::collections::BTreeMap::<Invariant, usize>::new();
    for seed in a.first_seed..a.first_seed + a.seeds {
        let left = total.saturating_sub(began.elapsed());
        if left < Duration::from_secs(20) {
            println!("chaos: time bound reached; {ran} of {} seeds run", a.seeds);
            break;
        }
        let cfg = Config {
            seed,
            ops: a.ops,
            workers: a.workers,
            fault_rate: a.fault_rate,
            // Crashes by turns (each restart stalls the workload for seconds): DynamoDB
            // Local on odd seeds, LocalStack on even ones (both when only one runs), a
            // serve process on every seed.
            crash_dynamodb: own_dynamodb && (seed % 2 == 1 || a.seeds == 1),
            kill_serve: true,
            restart_localstack: own_localstack && (seed % 2 == 0 || a.seeds == 1),
            time_limit: Duration::from_secs(a.seed_seconds).min(left - Duration::from_secs(15)),
        };
        let report = chaos.run_seed(&cfg).await;
        let found = check(&report.history);
        let lost = lost_in_storage_kills(&report.history);
        let mut line = format!(
            "{:>6} {:>5} {:>6} {:>7} {:>6.1}",
            report.seed,
            report.ops,
            report.failed,
            report.unknown,
            report.elapsed.as_secs_f64()
        );
        for k in &kinds {
            line.push_str(&format!(
                " {:>w$}",
                report.faults.get(*k),
                w = k.name().len().max(4)
            ));
        }
        line.push_str(&format!(
            " {:>8} {:>7} {:>10} {:>8} {:>10}",
            report.dynamodb_crashes,
            report.localstack_crashes,
            report.serve_kills,
            lost.len(),
            found.len()
        ));
        for (_, l) in &lost {
            println!("  lost by DynamoDB Local at its kill: {l}");
        }
        all_lost += lost.len();
        println!("{line}");
        if !found.is_empty() {
            let path = std::env::temp_dir().join(format!("tollgate-chaos-seed-{seed}.txt"));
            let _ = std::fs::write(&path, format!("{:#?}\n{:#?}", found, report.history));
            println!("  (history written to {})", path.display());
        }
        for v in &found {
            *by_invariant.entry(v.invariant).or_default() += 1;
            println!("  violation {:?}: {}", v.invariant, v.detail);
        }
        totals.add(&report.faults);
        all_ops += report.ops;
        all_failed += report.failed;
        all_unknown += report.unknown;
        crashes += report.dynamodb_crashes;
        ls_crashes += report.localstack_crashes;
        kills += report.serve_kills;
        ran += 1;
        violations.extend(found.into_iter().map(|v| (seed, v)));
    }
    let mut line = format!(
        "{:>6} {:>5} {:>6} {:>7} {:>6.1}",
        "total",
        all_ops,
        all_failed,
        all_unknown,
        began.elapsed().as_secs_f64()
    );
    for k in &kinds {
        line.push_str(&format!(
            " {:>w$}",
            totals.get(*k),
            w = k.name().len().max(4)
        ));
    }
    line.push_str(&format!(
        " {crashes:>8} {ls_crashes:>7} {kills:>10} {all_lost:>8} {:>10}",
        violations.len()
    ));
    println!("{line}");
    drop(chaos);
    let _ = std::fs::remove_dir_all(&db_dir);
    let missing: Vec<&str> = kinds
        .iter()
        .filter(|k| totals.get(**k) == 0)
        .map(|k| k.name())
        .collect();
    // Every fault kind and crash configured to run must have happened: a schedule that
    // never injects one tests nothing of it.
    let mut unexercised: Vec<String> = missing.iter().map(|m| format!("fault {m}")).collect();
    if kills == 0 {
        unexercised.push("serve kill".into());
    }
    if own_dynamodb && crashes == 0 {
        unexercised.push("DynamoDB Local kill".into());
    }
    if own_localstack && ls_crashes == 0 {
        unexercised.push("LocalStack kill".into());
    }
    if all_lost > 0 {
        println!(
            "chaos: {all_lost} acknowledged operation(s) lost by DynamoDB Local killed within {KILL_WINDOW_MS} ms after the proxy saw their transaction acknowledged (not counted as violations; tests/harness/dynamodb-kill-durability.sh shows the emulator doing so on its own)"
        );
    }
    if !violations.is_empty() {
        println!("chaos: {} violation(s): {by_invariant:?}", violations.len());
        std::process::exit(1);
    }
    if !unexercised.is_empty() {
        println!("chaos: configured but never injected: {unexercised:?}");
        std::process::exit(1);
    }
    if ran == 0 {
        println!("chaos: no seed ran");
        std::process::exit(1);
    }
    println!(
        "chaos: {ran} seeds, {all_ops} operations, {} faults, 0 violations",
        totals.total()
    );
}
