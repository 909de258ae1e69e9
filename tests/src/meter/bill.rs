//! What a scenario used, priced: the usage of each service, the bill's lines and its
//! rendering, and the Lambda compute assumed per invocation.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::*;

/// What one Lambda invocation is taken to cost in compute, for want of a measurement on
/// AWS: the template's `MemorySize` and an assumed billed duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LambdaAssumption {
    pub memory_mb: u32,
    /// Billed duration of one warm invocation.
    pub billed_ms: u32,
}

impl Default for LambdaAssumption {
    /// The lifecycle's functions' `MemorySize` as `infra/template.yaml` says (the
    /// largest, should they differ) × 50 ms: a warm invocation making up to three
    /// DynamoDB round trips of ~10 ms in-region plus its own work, rounded up. Cold
    /// starts (their INIT phase) are left out: they are shared by many lifecycles.
    fn default() -> Self {
        Self {
            memory_mb: super::template::max_memory_mb(&[
                "ingress",
                "approvals",
                "settlement",
                "timers",
            ]),
            billed_ms: 50,
        }
    }
}

impl LambdaAssumption {
    pub fn gb_seconds_per_invocation(&self) -> f64 {
        self.memory_mb as f64 / 1024.0 * self.billed_ms as f64 / 1000.0
    }
}

/// One DynamoDB operation's calls, billed.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamoUsage {
    pub operation: String,
    pub kind: CallKind,
    pub calls: u64,
    pub failed: u64,
    /// HTTP requests sent (retries included).
    pub attempts: u64,
    pub model: f64,
    /// Sum of what DynamoDB reported, over the calls it reported for.
    pub reported: Option<f64>,
    /// Σ max(model, reported) per call.
    pub billed: f64,
    /// Calls whose report exceeded the model.
    pub reported_won: u64,
    /// Model units by what they are for, e.g. `event Put` → 4.
    pub parts: BTreeMap<String, f64>,
    /// Reported units by table (`table`) and index (`index <name>`).
    pub reported_parts: BTreeMap<String, f64>,
    /// Global secondary index units written by transactions, billed once: what doubling
    /// them would add.
    pub gsi_in_transactions: f64,
}

impl DynamoUsage {
    /// One line per operation, in the order reads, writes, free; then by name.
    pub fn from_calls(calls: &[CallBill]) -> Vec<Self> {
        let mut by_op: BTreeMap<(CallKind, String), DynamoUsage> = BTreeMap::new();
        for c in calls {
            let u = by_op
                .entry((c.kind, c.operation.clone()))
                .or_insert_with(|| DynamoUsage {
                    operation: c.operation.clone(),
                    kind: c.kind,
                    calls: 0,
                    failed: 0,
                    attempts: 0,
                    model: 0.0,
                    reported: None,
                    billed: 0.0,
                    reported_won: 0,
                    parts: BTreeMap::new(),
                    reported_parts: BTreeMap::new(),
                    gsi_in_transactions: 0.0,
                });
            u.calls += 1;
            u.failed += c.failed as u64;
            u.attempts += c.attempts as u64;
            u.model += c.model;
            if let Some(r) = c.reported {
                *u.reported.get_or_insert(0.0) += r;
            }
            u.billed += c.billed();
            u.reported_won += c.reported_won() as u64;
            for (what, units) in &c.parts {
                *u.parts.entry(what.clone()).or_insert(0.0) += units;
            }
            for (what, units) in &c.reported_parts {
                *u.reported_parts.entry(what.clone()).or_insert(0.0) += units;
            }
            u.gsi_in_transactions += c.gsi_in_transactions;
        }
        by_op.into_values().collect()
    }
}

/// What a scenario used, before pricing.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub dynamo: Vec<DynamoUsage>,
    pub timers: TimerTally,
    pub http: Vec<HttpRequest>,
}

/// One priced line of a [`Bill`].
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub service: &'static str,
    pub item: String,
    /// Operations or requests counted.
    pub count: u64,
    /// Units billed (`WRU`, `RRU`, `requests`, `GB-s`).
    pub units: f64,
    pub unit: &'static str,
    pub usd_per_unit: f64,
    /// How the units were arrived at.
    pub note: String,
}

impl Line {
    pub fn usd(&self) -> f64 {
        self.units * self.usd_per_unit
    }
}

/// A priced scenario: one line per operation, and the assumptions it rests on.
#[derive(Debug, Clone, PartialEq)]
pub struct Bill {
    pub lines: Vec<Line>,
    pub assumptions: Vec<String>,
    /// The cross-check of the writes against what DynamoDB reported for them.
    pub writes: WriteCheck,
}

/// The writes DynamoDB reported capacity for: what it reported, what the model bills,
/// and the global index units transactions wrote (billed once; DynamoDB Local doubles
/// them, so its report exceeds the model by exactly these where both agree otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WriteCheck {
    pub reported: f64,
    pub model: f64,
    pub gsi_in_transactions: f64,
}

fn fmt_units(u: f64) -> String {
    if (u - u.round()).abs() < 1e-9 {
        format!("{}", u.round() as i64)
    } else if u < 10.0 {
        format!("{u:.3}")
    } else {
        format!("{u:.1}")
    }
}

impl Bill {
    /// Prices `usage` with [`prices`] and `lambda`'s compute assumption.
    pub fn price(usage: &Usage, lambda: LambdaAssumption) -> Self {
        use prices::*;
        let mut lines = Vec::new();
        for d in &usage.dynamo {
            let (unit, usd_per_unit) = match d.kind {
                CallKind::Read => ("RRU", DYNAMODB_RRU_USD),
                CallKind::Write => ("WRU", DYNAMODB_WRU_USD),
                CallKind::Free => ("-", 0.0),
            };
            let reported_parts = || {
                d.reported_parts
                    .iter()
                    .map(|(what, u)| format!("{what} {}", fmt_units(*u)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let source = match d.reported {
                None => "model (nothing reported)".to_owned(),
                Some(r) if d.kind == CallKind::Write => format!(
                    "model; DynamoDB reported {} ({})",
                    fmt_units(r),
                    reported_parts()
                ),
                Some(r) if d.reported_won == 0 => {
                    format!("model; DynamoDB reported {}", fmt_units(r))
                }
                Some(r) if d.reported_won == d.calls => {
                    format!("reported {}; model {}", fmt_units(r), fmt_units(d.model))
                }
                Some(r) => format!(
                    "max per call: reported on {} of {} calls; reported {}, model {}",
                    d.reported_won,
                    d.calls,
                    fmt_units(r),
                    fmt_units(d.model)
                ),
            };
            let parts: Vec<String> = d
                .parts
                .iter()
                .map(|(what, u)| format!("{what} {}", fmt_units(*u)))
                .collect();
            let mut note = source;
            if !parts.is_empty() {
                let _ = write!(note, " [{}]", parts.join(", "));
            }
            if d.failed > 0 {
                let _ = write!(note, "; {} failed, billed as if done", d.failed);
            }
            if d.attempts > d.calls {
                let _ = write!(note, "; {} HTTP attempts", d.attempts);
            }
            lines.push(Line {
                service: "DynamoDB",
                item: d.operation.clone(),
                count: d.calls,
                units: d.billed,
                unit,
                usd_per_unit,
                note,
            });
        }
        let t = &usage.timers;
        let by_kind = |m: &BTreeMap<&'static str, u64>| {
            m.iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (item, n, map, note) in [
            (
                "SendMessage",
                t.sent_total(),
                &t.sent,
                "one per timer scheduled",
            ),
            (
                "ReceiveMessage",
                t.delivered_total(),
                &t.delivered,
                "one per delivery (event source mapping; batching ignored)",
            ),
            (
                "DeleteMessage",
                t.acked_total(),
                &t.acked,
                "one per delivery acknowledged",
            ),
        ] {
            lines.push(Line {
                service: "SQS",
                item: item.into(),
                count: n,
                units: n as f64,
                unit: "requests",
                usd_per_unit: SQS_REQUEST_USD,
                note: format!("{note} [{}]", by_kind(map)),
            });
        }
        let mut by_function: BTreeMap<&'static str, Vec<&str>> = BTreeMap::new();
        for r in &usage.http {
            by_function.entry(r.function).or_default().push(&r.route);
        }
        let http = usage.http.len() as u64;
        lines.push(Line {
            service: "API Gateway",
            item: "HTTP API requests".into(),
            count: http,
            units: http as f64,
            unit: "requests",
            usd_per_unit: HTTP_API_REQUEST_USD,
            note: "one per HTTP request of the client".into(),
        });
        let mut invocations = 0;
        for (function, routes) in &by_function {
            let mut tally: Vec<(&str, u64)> = Vec::new();
            for r in routes {
                match tally.iter_mut().find(|(x, _)| x == r) {
                    Some((_, n)) => *n += 1,
                    None => tally.push((r, 1)),
                }
            }
            let n = routes.len() as u64;
            invocations += n;
            lines.push(Line {
                service: "Lambda",
                item: format!("{function} invocations"),
                count: n,
                units: n as f64,
                unit: "requests",
                usd_per_unit: LAMBDA_REQUEST_USD,
                note: tally
                    .iter()
                    .map(|(r, n)| format!("{r} ×{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let timer_invocations = t.delivered_total();
        invocations += timer_invocations;
        lines.push(Line {
            service: "Lambda",
            item: "timers invocations".into(),
            count: timer_invocations,
            units: timer_invocations as f64,
            unit: "requests",
            usd_per_unit: LAMBDA_REQUEST_USD,
            note: "one per timer delivered (batching ignored)".into(),
        });
        lines.push(Line {
            service: "Lambda",
            item: "compute".into(),
            count: invocations,
            units: invocations as f64 * lambda.gb_seconds_per_invocation(),
            unit: "GB-s",
            usd_per_unit: LAMBDA_GB_SECOND_USD,
            note: format!(
                "{} MB × {} ms per invocation (assumed), x86_64",
                lambda.memory_mb, lambda.billed_ms
            ),
        });
        let gsi_once: f64 = usage.dynamo.iter().map(|d| d.gsi_in_transactions).sum();
        let mut writes = WriteCheck::default();
        for d in &usage.dynamo {
            if let (CallKind::Write, Some(r)) = (d.kind, d.reported) {
                writes.reported += r;
                writes.model += d.model;
                writes.gsi_in_transactions += d.gsi_in_transactions;
            }
        }
        let mut assumptions = vec![
            format!(
                "prices: us-east-1 on demand as of {AS_OF} (DynamoDB after its 2024-11-01 \
                 price cut; x86_64 Lambda), free tiers ignored"
            ),
            "DynamoDB writes: the model (item sizes by DynamoDB's rules: 1 WRU/KB per item \
             written, ×2 in a transaction incl. ConditionCheck; an index entry 1 WRU/KB of \
             what the index projects, written only when the item enters or leaves the index \
             or changes its keys (2) or a projected attribute, as AWS documents (GSI.html \
             #GSI.ThroughputConsiderations.Writes); a local index's entry ×2 in a \
             transaction, a global index's once (updated asynchronously, from its own \
             capacity)). DynamoDB Local's report is shown beside it, not billed for \
             writes: it agrees on the items and on which index entries are written, and \
             doubles a transaction's global index entries too (the line below)"
                .into(),
            "DynamoDB reads: per call the larger of the model (1 RRU/4 KB strongly \
             consistent, 0.5 eventually, ×2 per item in TransactGetItems; Query on the \
             total read, a read finding nothing at the minimum) and what DynamoDB reported"
                .into(),
            format!(
                "Lambda: {} MB × {} ms billed per warm invocation (assumed, not measured); \
                 cold-start INIT and the SQS pollers' empty receives are fixed costs, not \
                 per lifecycle",
                lambda.memory_mb, lambda.billed_ms
            ),
        ];
        if gsi_once > 0.0 {
            assumptions.push(format!(
                "DynamoDB: global index entries written by transactions, {} WRU billed once; \
                 were they doubled like the items, +${:.7}. Cross-check: DynamoDB Local \
                 reported {} WRU for the writes it reported on, the model {}",
                fmt_units(gsi_once),
                gsi_once * DYNAMODB_WRU_USD,
                fmt_units(writes.reported),
                fmt_units(writes.model),
            ));
        }
        Self {
            lines,
            assumptions,
            writes,
        }
    }

    pub fn total_usd(&self) -> f64 {
        self.lines.iter().map(Line::usd).sum()
    }

    /// What was counted, by `service item` (calls or requests) and, for DynamoDB,
    /// `… units` (billed request units ×10, to keep halves whole): equal for two runs of
    /// the same scenario when it is deterministic.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for l in &self.lines {
            if l.unit == "GB-s" {
                continue;
            }
            out.insert(format!("{} {}", l.service, l.item), l.count);
            if l.service == "DynamoDB" {
                out.insert(
                    format!("{} {} {}×10", l.service, l.item, l.unit),
                    (l.units * 10.0).round() as u64,
                );
            }
        }
        out
    }

    /// A readable table: one line per operation, then the total and the assumptions.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>6} {:>10} {:<8} {:>13}  how",
            "service", "operation", "count", "units", "unit", "USD"
        );
        for l in &self.lines {
            let _ = writeln!(
                s,
                "{:<12} {:<22} {:>6} {:>10} {:<8} {:>13.10}  {}",
                l.service,
                l.item,
                l.count,
                fmt_units(l.units),
                l.unit,
                l.usd(),
                l.note
            );
        }
        let mut services: Vec<&'static str> = Vec::new();
        for l in &self.lines {
            if !services.contains(&l.service) {
                services.push(l.service);
            }
        }
        for service in services {
            let usd: f64 = self
                .lines
                .iter()
                .filter(|l| l.service == service)
                .map(Line::usd)
                .sum();
            let _ = writeln!(s, "{:<12} {:<22} {:>41.10}", service, "subtotal", usd);
        }
        let _ = writeln!(s, "{:<35} {:>41.10}", "TOTAL (USD)", self.total_usd());
        for a in &self.assumptions {
            let _ = writeln!(s, "  * {a}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(kind: CallKind, op: &str, calls: u64, billed: f64) -> DynamoUsage {
        DynamoUsage {
            operation: op.into(),
            kind,
            calls,
            failed: 0,
            attempts: calls,
            model: billed,
            reported: None,
            billed,
            reported_won: 0,
            parts: BTreeMap::new(),
            reported_parts: BTreeMap::new(),
            gsi_in_transactions: 0.0,
        }
    }

    /// GIVEN 3 RRU, 20 WRU, 7 timers sent/delivered/acked and 7 HTTP requests (256 MB ×
    /// 50 ms each invocation) WHEN priced THEN each line and the total are the list
    /// prices times the units.
    #[test]
    fn a_known_usage_prices_to_known_dollars() {
        let seven: BTreeMap<&'static str, u64> =
            [("approval_heartbeat", 4), ("approval_expiry", 3)].into();
        let usage = Usage {
            dynamo: vec![
                usage(CallKind::Read, "GetItem", 3, 3.0),
                usage(CallKind::Write, "TransactWriteItems", 5, 20.0),
            ],
            timers: TimerTally {
                sent: seven.clone(),
                delivered: seven.clone(),
                acked: seven,
                in_flight: 0,
            },
            http: (0..7)
                .map(|_| HttpRequest {
                    function: "ingress",
                    route: "POST /api/runs".into(),
                })
                .collect(),
        };
        let bill = Bill::price(&usage, LambdaAssumption::default());
        let usd = |service: &str, item: &str| {
            bill.lines
                .iter()
                .find(|l| l.service == service && l.item == item)
                .unwrap_or_else(|| panic!("{service} {item}"))
                .usd()
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-15, "{a} != {b}");
        close(usd("DynamoDB", "GetItem"), 3.0 * 0.125e-6);
        close(usd("DynamoDB", "TransactWriteItems"), 20.0 * 0.625e-6);
        close(usd("SQS", "SendMessage"), 7.0 * 0.40e-6);
        close(usd("SQS", "ReceiveMessage"), 7.0 * 0.40e-6);
        close(usd("SQS", "DeleteMessage"), 7.0 * 0.40e-6);
        close(usd("API Gateway", "HTTP API requests"), 7.0 * 1.00e-6);
        close(usd("Lambda", "ingress invocations"), 7.0 * 0.20e-6);
        close(usd("Lambda", "timers invocations"), 7.0 * 0.20e-6);
        // 14 invocations × 0.25 GB × 0.05 s = 0.175 GB-s.
        close(usd("Lambda", "compute"), 0.175 * 0.000_016_666_7);
        // 0.375 + 12.5 + 8.4 + 7 + 2.8 + 2.91667… µ$
        close(bill.total_usd(), 33.991_672_5e-6);
        assert!(bill.render().contains("TOTAL (USD)"));
        assert_eq!(bill.counts()["DynamoDB TransactWriteItems"], 5);
        assert_eq!(bill.counts()["DynamoDB TransactWriteItems WRU×10"], 200);
        assert_eq!(bill.counts()["SQS ReceiveMessage"], 7);
    }
}
