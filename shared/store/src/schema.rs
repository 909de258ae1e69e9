//! Table definitions come from one place: `infra/template.yaml`. `tollgate serve
//! --backend aws`, the integration tests and the benchmarks create their tables from the
//! template's `AWS::DynamoDB::Table` resources, so local tables cannot drift from what
//! is deployed.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    LocalSecondaryIndex, Projection, ProjectionType, ScalarAttributeType, StreamSpecification,
    StreamViewType, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use serde_yaml_ng::Value;

use crate::dynamo::Tables;
use crate::StoreError;

/// The deployment template, compiled in.
pub const TEMPLATE: &str = include_str!("../../../infra/template.yaml");

/// One table as the template declares it, in plain data (comparable in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDef {
    /// The template's logical id, e.g. `RunsTable`.
    pub logical_id: String,
    /// `(name, type)` pairs, type `S`/`N`/`B`.
    pub attributes: Vec<(String, String)>,
    /// `(name, HASH|RANGE)`.
    pub key: Vec<(String, String)>,
    pub local_indexes: Vec<IndexDef>,
    pub global_indexes: Vec<IndexDef>,
    pub ttl_attribute: Option<String>,
    /// `StreamSpecification.StreamViewType` (`NEW_IMAGE` on the events table: what the
    /// live-delivery stream readers consume, docs/architecture.md §5), if the table has a
    /// stream.
    pub stream_view: Option<String>,
}

/// `(index name, key, projection)`; the projection is its type, and for `INCLUDE` the
/// projected attributes too: `INCLUDE:a,b,c` (in the template's order).
pub type IndexDef = (String, Vec<(String, String)>, String);

/// The projection of an [`IndexDef`] as one comparable string.
fn projection_label(kind: &str, non_key: &[String]) -> String {
    if kind == "INCLUDE" {
        format!("INCLUDE:{}", non_key.join(","))
    } else {
        kind.to_owned()
    }
}

/// The SDK projection of an [`IndexDef`]'s projection string.
fn projection_of(label: &str) -> Projection {
    match label.split_once(':') {
        Some((kind, attrs)) => Projection::builder()
            .projection_type(ProjectionType::from(kind))
            .set_non_key_attributes(Some(attrs.split(',').map(str::to_owned).collect()))
            .build(),
        None => Projection::builder()
            .projection_type(ProjectionType::from(label))
            .build(),
    }
}

/// Which physical table a logical id maps to.
pub fn physical_name(tables: &Tables, logical_id: &str) -> Option<String> {
    match logical_id {
        "RunsTable" => Some(tables.runs.clone()),
        "EventsTable" => Some(tables.events.clone()),
        "ApprovalsTable" => Some(tables.approvals.clone()),
        "PoliciesTable" => Some(tables.policies.clone()),
        "MutationsTable" => Some(tables.mutations.clone()),
        "ConnectionsTable" => Some(tables.connections.clone()),
        "DeliveriesTable" => Some(tables.deliveries.clone()),
        _ => None,
    }
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn pairs(list: Option<&Value>, a: &str, b: &str) -> Vec<(String, String)> {
    list.and_then(Value::as_sequence)
        .map(|seq| {
            seq.iter()
                .filter_map(|e| Some((str_at(e, a)?.to_owned(), str_at(e, b)?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Parses every `AWS::DynamoDB::Table` resource of a template.
pub fn table_defs(template: &str) -> Result<Vec<TableDef>, String> {
    let doc: Value = serde_yaml_ng::from_str(template).map_err(|e| format!("template: {e}"))?;
    let resources = doc
        .get("Resources")
        .and_then(Value::as_mapping)
        .ok_or("template has no Resources")?;
    let mut defs = Vec::new();
    for (id, res) in resources {
        if str_at(res, "Type") != Some("AWS::DynamoDB::Table") {
            continue;
        }
        let props = res.get("Properties").ok_or("table without Properties")?;
        let indexes = |kind: &str| -> Vec<IndexDef> {
            props
                .get(kind)
                .and_then(Value::as_sequence)
                .map(|seq| {
                    seq.iter()
                        .map(|i| {
                            (
                                str_at(i, "IndexName").unwrap_or_default().to_owned(),
                                pairs(i.get("KeySchema"), "AttributeName", "KeyType"),
                                {
                                    let p = i.get("Projection");
                                    let kind = p
                                        .and_then(|p| str_at(p, "ProjectionType"))
                                        .unwrap_or("ALL");
                                    let non_key: Vec<String> = p
                                        .and_then(|p| p.get("NonKeyAttributes"))
                                        .and_then(Value::as_sequence)
                                        .map(|seq| {
                                            seq.iter()
                                                .filter_map(Value::as_str)
                                                .map(str::to_owned)
                                                .collect()
                                        })
                                        .unwrap_or_default();
                                    projection_label(kind, &non_key)
                                },
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let local_indexes = indexes("LocalSecondaryIndexes");
        let global_indexes = indexes("GlobalSecondaryIndexes");
        let ttl = props.get("TimeToLiveSpecification").and_then(|t| {
            (t.get("Enabled").and_then(Value::as_bool) == Some(true))
                .then(|| str_at(t, "AttributeName").map(str::to_owned))
                .flatten()
        });
        let stream_view = props
            .get("StreamSpecification")
            .and_then(|s| str_at(s, "StreamViewType"))
            .map(str::to_owned);
        defs.push(TableDef {
            logical_id: id.as_str().unwrap_or_default().to_owned(),
            attributes: pairs(
                props.get("AttributeDefinitions"),
                "AttributeName",
                "AttributeType",
            ),
            key: pairs(props.get("KeySchema"), "AttributeName", "KeyType"),
            local_indexes,
            global_indexes,
            ttl_attribute: ttl,
            stream_view,
        });
    }
    Ok(defs)
}

/// Reads a live table back into a [`TableDef`] (used to prove local tables match).
pub async fn describe(
    client: &Client,
    name: &str,
    logical_id: &str,
) -> Result<TableDef, StoreError> {
    let out = client
        .describe_table()
        .table_name(name)
        .send()
        .await
        .map_err(|e| StoreError::Unavailable(format!("describe {name}: {e}")))?;
    let table = out
        .table
        .ok_or_else(|| StoreError::Unavailable("no table".into()))?;
    let key = |ks: &[KeySchemaElement]| -> Vec<(String, String)> {
        ks.iter()
            .map(|k| (k.attribute_name.clone(), k.key_type.as_str().to_owned()))
            .collect()
    };
    let ttl = client
        .describe_time_to_live()
        .table_name(name)
        .send()
        .await
        .ok()
        .and_then(|o| o.time_to_live_description)
        .filter(|d| {
            matches!(
                d.time_to_live_status.as_ref().map(|s| s.as_str()),
                Some("ENABLED" | "ENABLING")
            )
        })
        .and_then(|d| d.attribute_name);
    let mut attributes: Vec<(String, String)> = table
        .attribute_definitions()
        .iter()
        .map(|a| {
            (
                a.attribute_name.clone(),
                a.attribute_type.as_str().to_owned(),
            )
        })
        .collect();
    attributes.sort();
    let stream_view = table
        .stream_specification()
        .filter(|s| s.stream_enabled())
        .and_then(|s| s.stream_view_type())
        .map(|v| v.as_str().to_owned());
    Ok(TableDef {
        logical_id: logical_id.to_owned(),
        attributes,
        key: key(table.key_schema()),
        local_indexes: table
            .local_secondary_indexes()
            .iter()
            .map(|i| {
                (
                    i.index_name().unwrap_or_default().to_owned(),
                    key(i.key_schema()),
                    i.projection()
                        .and_then(|p| p.projection_type())
                        .map(|t| t.as_str().to_owned())
                        .unwrap_or_default(),
                )
            })
            .collect(),
        global_indexes: table
            .global_secondary_indexes()
            .iter()
            .map(|i| {
                (
                    i.index_name().unwrap_or_default().to_owned(),
                    key(i.key_schema()),
                    i.projection()
                        .map(|p| {
                            projection_label(
                                p.projection_type().map(|t| t.as_str()).unwrap_or_default(),
                                p.non_key_attributes(),
                            )
                        })
                        .unwrap_or_default(),
                )
            })
            .collect(),
        ttl_attribute: ttl,
        stream_view,
    })
}

/// Creates every table the template declares that does not exist yet, on-demand, with
/// its TTL attribute, and waits until each is active.
pub async fn ensure_tables(client: &Client, tables: &Tables) -> Result<(), StoreError> {
    let defs = table_defs(TEMPLATE).map_err(StoreError::Unavailable)?;
    for def in defs {
        let Some(name) = physical_name(tables, &def.logical_id) else {
            continue;
        };
        if let Ok(existing) = client.describe_table().table_name(&name).send().await {
            // A table made before it had a stream gets one (the live-delivery readers
            // need it); nothing else of an existing table is changed.
            let has_stream = existing
                .table
                .as_ref()
                .and_then(|t| t.stream_specification())
                .is_some_and(|s| s.stream_enabled());
            if let (Some(view), false) = (&def.stream_view, has_stream) {
                client
                    .update_table()
                    .table_name(&name)
                    .stream_specification(stream_spec(view)?)
                    .send()
                    .await
                    .map_err(|e| {
                        StoreError::Unavailable(format!(
                            "enable the stream of {name}: {}",
                            aws_sdk_dynamodb::error::DisplayErrorContext(e)
                        ))
                    })?;
            }
            continue;
        }
        create_table(client, &name, &def).await?;
    }
    Ok(())
}

fn stream_spec(view: &str) -> Result<StreamSpecification, StoreError> {
    StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::from(view))
        .build()
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

fn key_schema(key: &[(String, String)]) -> Result<Vec<KeySchemaElement>, StoreError> {
    key.iter()
        .map(|(a, t)| {
            KeySchemaElement::builder()
                .attribute_name(a)
                .key_type(KeyType::from(t.as_str()))
                .build()
                .map_err(|e| StoreError::Unavailable(e.to_string()))
        })
        .collect()
}

async fn create_table(client: &Client, name: &str, def: &TableDef) -> Result<(), StoreError> {
    let err = |e: String| StoreError::Unavailable(format!("create table {name}: {e}"));
    let mut req = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(key_schema(&def.key)?));
    if let Some(view) = &def.stream_view {
        req = req.stream_specification(stream_spec(view)?);
    }
    for (attr, ty) in &def.attributes {
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(attr)
                .attribute_type(ScalarAttributeType::from(ty.as_str()))
                .build()
                .map_err(|e| err(e.to_string()))?,
        );
    }
    for (index, key, projection) in &def.local_indexes {
        req = req.local_secondary_indexes(
            LocalSecondaryIndex::builder()
                .index_name(index)
                .set_key_schema(Some(key_schema(key)?))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(projection.as_str()))
                        .build(),
                )
                .build()
                .map_err(|e| err(e.to_string()))?,
        );
    }
    for (index, key, projection) in &def.global_indexes {
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(index)
                .set_key_schema(Some(key_schema(key)?))
                .projection(projection_of(projection))
                .build()
                .map_err(|e| err(e.to_string()))?,
        );
    }
    let created_here = match req.send().await {
        Ok(_) => true,
        // Another process created it between our describe and create: it also owns the
        // TTL step; we only wait for the table to become active.
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_resource_in_use_exception()) =>
        {
            false
        }
        Err(e) => {
            return Err(err(format!(
                "{}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )))
        }
    };
    for _ in 0..120 {
        let status = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .ok()
            .and_then(|o| o.table)
            .and_then(|t| t.table_status);
        if status.as_ref().map(|s| s.as_str()) == Some("ACTIVE") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    if let (true, Some(attr)) = (created_here, &def.ttl_attribute) {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(attr)
            .enabled(true)
            .build()
            .map_err(|e| err(e.to_string()))?;
        client
            .update_time_to_live()
            .table_name(name)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| {
                err(format!(
                    "ttl: {}",
                    aws_sdk_dynamodb::error::DisplayErrorContext(e)
                ))
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_declares_runs_and_events() {
        let defs = table_defs(TEMPLATE).unwrap();
        let events = defs.iter().find(|d| d.logical_id == "EventsTable").unwrap();
        assert_eq!(
            events.key,
            vec![
                ("run_id".into(), "HASH".into()),
                ("event_key".into(), "RANGE".into())
            ]
        );
        assert_eq!(events.local_indexes[0].0, crate::dynamo::BY_SEQUENCE_INDEX);
        assert_eq!(events.ttl_attribute.as_deref(), Some("expires_at"));
        assert_eq!(events.stream_view.as_deref(), Some("NEW_IMAGE"));
        assert!(defs.iter().any(|d| d.logical_id == "RunsTable"));
    }
}
