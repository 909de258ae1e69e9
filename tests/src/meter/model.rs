//! DynamoDB's billing model: item sizes by its own rules, the tables' key schemas and
//! indexes, and what one written item and one transaction cost in write units.

use std::collections::{HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use tollgate_store::dynamo::Tables;

pub type Item = HashMap<String, AttributeValue>;

/// DynamoDB's size of a number: 1 byte per two significant digits, plus 1.
pub fn number_size(n: &str) -> usize {
    let mantissa = n.split(['e', 'E']).next().unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    significant.max(1).div_ceil(2) + 1
}

/// DynamoDB's size of one attribute value (without its name).
pub fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(v) => 3 + v.iter().map(|e| 1 + value_size(e)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, e)| 1 + k.len() + value_size(e))
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// DynamoDB's item size: the attribute names' UTF-8 lengths plus the values' sizes.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// Units of `unit` bytes, rounded up per item (a write of 0 bytes still costs one).
pub fn units(bytes: usize, unit: usize) -> u64 {
    bytes.max(1).div_ceil(unit) as u64
}

/// What an index projects (`ProjectionType`, and `NonKeyAttributes` for `INCLUDE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projected {
    /// `ALL`: an entry is the whole item.
    All,
    /// `KEYS_ONLY` (empty) or `INCLUDE` these non-key attributes: an entry is the table's
    /// key, the index's key and these.
    Only(Vec<String>),
}

/// One secondary index as the template declares it.
#[derive(Debug, Clone)]
pub struct IndexInfo {
    pub name: String,
    pub key: Vec<String>,
    pub projected: Projected,
    /// A local secondary index (maintained with the item, from the table's capacity);
    /// otherwise global (updated asynchronously, its own capacity).
    pub local: bool,
}

impl IndexInfo {
    /// The index entry of `item` (which carries the index's key): what DynamoDB copies
    /// into the index, keyed by the table's key `table_key`.
    pub fn entry(&self, table_key: &[String], item: &Item) -> Item {
        match &self.projected {
            Projected::All => item.clone(),
            Projected::Only(attrs) => item
                .iter()
                .filter(|(k, _)| table_key.contains(k) || self.key.contains(k) || attrs.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

/// One table as the template declares it: what its items are, key, indexes.
#[derive(Debug, Clone)]
pub struct TableInfo {
    pub label: &'static str,
    pub key: Vec<String>,
    pub indexes: Vec<IndexInfo>,
}

/// Physical table name → its definition, from the deployment template.
pub fn table_infos(tables: &Tables) -> HashMap<String, TableInfo> {
    use tollgate_store::schema::{physical_name, table_defs, TEMPLATE};
    let defs = table_defs(TEMPLATE).expect("the template's tables");
    let names = |pairs: Vec<(String, String)>| pairs.into_iter().map(|(a, _)| a).collect();
    defs.into_iter()
        .filter_map(|def| {
            let physical = physical_name(tables, &def.logical_id)?;
            let label = match def.logical_id.as_str() {
                "RunsTable" => "head",
                "EventsTable" => "event",
                "ApprovalsTable" => "card",
                "PoliciesTable" => "policy",
                "MutationsTable" => "mutation",
                _ => "item",
            };
            let index = |local: bool| {
                move |(name, key, projection): (String, Vec<(String, String)>, String)| {
                    let projected = match projection.split_once(':') {
                        None if projection == "ALL" => Projected::All,
                        None => Projected::Only(Vec::new()),
                        Some((_, attrs)) => {
                            Projected::Only(attrs.split(',').map(str::to_owned).collect())
                        }
                    };
                    IndexInfo {
                        name,
                        key: names(key),
                        projected,
                        local,
                    }
                }
            };
            let indexes = def
                .local_indexes
                .into_iter()
                .map(index(true))
                .chain(def.global_indexes.into_iter().map(index(false)))
                .collect();
            Some((
                physical,
                TableInfo {
                    label,
                    key: names(def.key),
                    indexes,
                },
            ))
        })
        .collect()
}

/// The last known image of items, by [`model_key`].
pub type Model = HashMap<String, Item>;

/// `table|key attribute values…`: one item of one table.
pub fn model_key(info: &TableInfo, table: &str, attrs: &Item) -> String {
    let mut key = table.to_owned();
    for name in &info.key {
        key.push_str(&format!("|{:?}", attrs.get(name)));
    }
    key
}

/// What an item is, for the tables: its table's label, `route` for a coordinator's route
/// item, and `coordinator head`/`coordinator event` on a run in `coordinators`.
fn item_label(info: &TableInfo, attrs: &Item, coordinators: &HashSet<String>) -> String {
    let mut label = info.label.to_owned();
    if let Some(AttributeValue::S(k)) = attrs.get("item_key") {
        if k.starts_with("route#") {
            label = "route".into();
        }
    }
    if let Some(AttributeValue::S(run)) = attrs.get("run_id") {
        if coordinators.contains(run) && (label == "head" || label == "event") {
            label = format!("coordinator {label}");
        }
    }
    label
}

/// One item of a write as AWS bills it.
#[derive(Debug, Clone)]
pub struct ItemBill {
    pub label: String,
    pub op: &'static str,
    /// The larger of the item before and after the write.
    pub bytes: usize,
    /// Write units: 1 per started KB, 2 in a transaction.
    pub wcu: u64,
}

/// One index entry written.
#[derive(Debug, Clone)]
pub struct IndexWrite {
    pub index: String,
    /// KB-units of the entry (1 per started KB). Not multiplied for transactions: see
    /// [`IndexWrite::multiplier`].
    pub units: u64,
    pub local: bool,
}

impl IndexWrite {
    /// How AWS bills an index entry written by a transaction (docs/architecture.md
    /// §3, "What a write costs"): a transaction makes two underlying writes of every
    /// *item* in it (prepare, commit); a global secondary index is updated
    /// asynchronously from the table, from its own capacity, one write per entry as for
    /// any write, so it is not doubled. A local secondary index is maintained with the
    /// item, from the table's capacity: doubled like the item (the upper bound).
    pub fn multiplier(&self, transactional: bool) -> u64 {
        if transactional && self.local {
            2
        } else {
            1
        }
    }
}

/// One write call (a transaction, or a single- or batch-item write) as AWS bills it.
#[derive(Debug, Clone, Default)]
pub struct TxBill {
    pub items: Vec<ItemBill>,
    /// Each index entry written (a moved entry is a delete plus a put).
    pub index: Vec<IndexWrite>,
}

/// One item written, as a write names it.
#[derive(Debug, Clone, Copy)]
pub struct Written<'a> {
    /// `Put`, `Update`, `Delete` or `ConditionCheck`.
    pub op: &'static str,
    pub table: &'a str,
    /// A `Put`'s item, the key otherwise.
    pub attrs: &'a Item,
    /// The item's images before and after the write (`None`: absent or unknown).
    pub before: Option<&'a Item>,
    pub after: Option<&'a Item>,
}

/// Bills one item written, `multiplier` 2 in a transaction, into `out`. Index entries
/// follow DynamoDB's documented rule (docs/architecture.md §3, "What a write costs"):
/// an entry is written when the item enters the index (1), leaves it (1), changes an
/// index key (2: delete and put) or changes a projected attribute (1); a write that
/// changes neither writes no entry. An entry is sized as what the index projects.
pub fn bill_item<'a>(
    tables: &HashMap<String, TableInfo>,
    coordinators: &HashSet<String>,
    w: Written<'a>,
    multiplier: u64,
    out: &mut TxBill,
) {
    let Written {
        op,
        table,
        attrs,
        before,
        after,
    } = w;
    let Some(info) = tables.get(table) else {
        // A table outside the template (the bench's baselines): sized from what it names.
        out.items.push(ItemBill {
            label: "item".into(),
            op,
            bytes: item_size(attrs),
            wcu: multiplier * units(item_size(attrs), 1024),
        });
        return;
    };
    let bytes = before
        .map(item_size)
        .unwrap_or(0)
        .max(after.map(item_size).unwrap_or(0));
    out.items.push(ItemBill {
        label: item_label(info, attrs, coordinators),
        op,
        bytes,
        wcu: multiplier * units(bytes, 1024),
    });
    for index in &info.indexes {
        let entry = |i: Option<&'a Item>| {
            i.filter(|i| index.key.iter().all(|k| i.contains_key(k)))
                .map(|i| index.entry(&info.key, i))
        };
        let entries: Vec<usize> = match (entry(before), entry(after)) {
            (None, None) => vec![],
            (None, Some(a)) => vec![item_size(&a)],
            (Some(b), None) => vec![item_size(&b)],
            (Some(b), Some(a)) if index.key.iter().any(|k| b.get(k) != a.get(k)) => {
                vec![item_size(&b), item_size(&a)] // the entry moves: delete + put
            }
            (Some(b), Some(a)) if b != a => vec![item_size(&b).max(item_size(&a))],
            _ => vec![], // neither its keys nor what it projects changed
        };
        for size in entries {
            out.index.push(IndexWrite {
                index: index.name.clone(),
                units: units(size, 1024),
                local: index.local,
            });
        }
    }
}

/// Bills one transaction from the items it names, their images before (`pre`) and after
/// (`post`; a `Put`'s own item), with DynamoDB's sizing rules: 2 write units per started
/// KB per item.
pub fn bill<'a>(
    tables: &HashMap<String, TableInfo>,
    coordinators: &HashSet<String>,
    tx: &'a [TransactWriteItem],
    pre: &'a Model,
    post: &'a Model,
) -> TxBill {
    let mut out = TxBill::default();
    for w in tx {
        let Some((op, table, attrs)) = transact_write_parts(w) else {
            continue;
        };
        let Some(info) = tables.get(table) else {
            let w = Written {
                op,
                table,
                attrs,
                before: None,
                after: Some(attrs),
            };
            bill_item(tables, coordinators, w, 2, &mut out);
            continue;
        };
        let key = model_key(info, table, attrs);
        let before = pre.get(&key);
        let after = match op {
            "Put" => Some(attrs),
            "Delete" => None,
            "ConditionCheck" => before,
            _ => post.get(&key),
        };
        let w = Written {
            op,
            table,
            attrs,
            before,
            after,
        };
        bill_item(tables, coordinators, w, 2, &mut out);
    }
    out
}

/// `(op, table, item or key)` of one transaction item.
pub(super) fn transact_write_parts(w: &TransactWriteItem) -> Option<(&'static str, &str, &Item)> {
    if let Some(p) = w.put() {
        Some(("Put", p.table_name(), p.item()))
    } else if let Some(u) = w.update() {
        Some(("Update", u.table_name(), u.key()))
    } else if let Some(d) = w.delete() {
        Some(("Delete", d.table_name(), d.key()))
    } else {
        w.condition_check()
            .map(|c| ("ConditionCheck", c.table_name(), c.key()))
    }
}

/// Test support: a string attribute.
#[cfg(test)]
pub(super) fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// Test support: a number attribute.
#[cfg(test)]
pub(super) fn n(v: &str) -> AttributeValue {
    AttributeValue::N(v.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_dynamodb_rules() {
        assert_eq!(number_size("0"), 2);
        assert_eq!(number_size("12"), 2);
        assert_eq!(number_size("123"), 3);
        assert_eq!(number_size("1700000000000"), 2); // 2 significant digits
        assert_eq!(number_size("-1.5e10"), 2);
        let item: Item = [("run_id".to_owned(), s("abc")), ("n".to_owned(), n("42"))].into();
        assert_eq!(item_size(&item), 6 + 3 + 1 + 2);
        assert_eq!(units(0, 1024), 1);
        assert_eq!(units(1024, 1024), 1);
        assert_eq!(units(1025, 1024), 2);
        assert_eq!(units(4097, 4096), 2);
    }

    /// GIVEN the runs table's `runs_by_project` (INCLUDE: the listing's fields) and a
    /// head WHEN it is created, appended to (only `next_seq` changes) and ended (its
    /// `status` changes), each in a transaction THEN the index entry is written at the
    /// creation and the end only, once each (a global index is not doubled), sized as
    /// what it projects; the items themselves are doubled.
    #[test]
    fn an_index_entry_is_written_only_when_its_keys_or_projection_change() {
        use tollgate_store::dynamo::Tables;
        let tables = table_infos(&Tables::with_prefix("t-"));
        let head = |seq: &str, status: &str| -> Item {
            [
                ("run_id".to_owned(), s("r")),
                ("project_runs".to_owned(), s("p:alpha")),
                ("created_at".to_owned(), n("1700000000000")),
                ("status".to_owned(), s(status)),
                ("next_seq".to_owned(), n(seq)),
                ("pad".to_owned(), s(&"x".repeat(1500))),
            ]
            .into()
        };
        let key: Item = [("run_id".to_owned(), s("r"))].into();
        let bill = |before: Option<&Item>, after: Option<&Item>| {
            let mut out = TxBill::default();
            let w = Written {
                op: "Update",
                table: "t-runs",
                attrs: &key,
                before,
                after,
            };
            bill_item(&tables, &HashSet::new(), w, 2, &mut out);
            out
        };
        let (created, appended, ended) = (
            head("1", "running"),
            head("2", "running"),
            head("3", "completed"),
        );
        let listed = |b: &TxBill| -> Vec<(u64, u64)> {
            b.index
                .iter()
                .filter(|i| i.index == "runs_by_project")
                .map(|i| (i.units, i.multiplier(true)))
                .collect()
        };
        let create = bill(None, Some(&created));
        assert_eq!(create.items[0].wcu, 4, "a 1.5 KB head, doubled");
        assert_eq!(
            listed(&create),
            [(1, 1)],
            "the entry is small: the pad is not projected"
        );
        let append = bill(Some(&created), Some(&appended));
        assert_eq!(append.items[0].wcu, 4);
        assert_eq!(listed(&append), [], "next_seq is not projected");
        assert_eq!(listed(&bill(Some(&appended), Some(&ended))), [(1, 1)]);
        let mut moved = ended.clone();
        moved.insert("project_runs".into(), s("p:beta"));
        assert_eq!(
            listed(&bill(Some(&ended), Some(&moved))),
            [(1, 1), (1, 1)],
            "delete + put"
        );
    }
}
