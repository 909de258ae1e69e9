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

/// One secondary index as the template declares it.
#[derive(Debug, Clone)]
pub struct IndexInfo {
    pub name: String,
    pub key: Vec<String>,
    /// `ProjectionType: ALL` (an index entry is the whole item).
    pub all: bool,
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
            let indexes = def
                .local_indexes
                .into_iter()
                .chain(def.global_indexes)
                .map(|(name, key, projection)| IndexInfo {
                    name,
                    key: names(key),
                    all: projection == "ALL",
                })
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

/// One write call (a transaction, or a single- or batch-item write) as AWS bills it.
#[derive(Debug, Clone, Default)]
pub struct TxBill {
    pub items: Vec<ItemBill>,
    /// Index name → KB-units of each index entry written (1 per started KB; a moved
    /// entry is a delete plus a put). Not multiplied for transactions: see
    /// [`TxBill::index_multiplier`].
    pub index: Vec<(String, u64)>,
}

impl TxBill {
    /// How AWS is taken to bill a transaction's index entries: doubled like its items
    /// (the upper bound of the two readings of the price page).
    pub fn index_multiplier(transactional: bool) -> u64 {
        if transactional {
            2
        } else {
            1
        }
    }
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
/// are sized as the whole item (exact for `ALL` projections, every index of the
/// template).
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
        let in_index =
            |i: Option<&'a Item>| i.filter(|i| index.key.iter().all(|k| i.contains_key(k)));
        let entries: Vec<usize> = match (in_index(before), in_index(after)) {
            (None, None) => vec![],
            (None, Some(a)) => vec![item_size(a)],
            (Some(b), None) => vec![item_size(b)],
            (Some(b), Some(a)) if index.key.iter().any(|k| b.get(k) != a.get(k)) => {
                vec![item_size(b), item_size(a)] // the entry moves: delete + put
            }
            (Some(b), Some(a)) if b != a => vec![item_size(b).max(item_size(a))],
            _ => vec![],
        };
        let name = if index.all {
            index.name.clone()
        } else {
            format!("{} (not ALL: sized as the whole item)", index.name)
        };
        for size in entries {
            out.index.push((name.clone(), units(size, 1024)));
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
}
