//! The store contract against DynamoDB: DynamoDB Local started by `make test`, or any
//! endpoint in `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_DYNAMODB` (or real AWS credentials).
use std::sync::Arc;

use tollgate_store::dynamo::{DynamoStore, Tables};

async fn dynamo_store() -> tollgate_store::contract::Store {
    assert!(
        std::env::var_os("AWS_ENDPOINT_URL_DYNAMODB").is_some()
            || std::env::var_os("AWS_ENDPOINT_URL").is_some()
            || std::env::var_os("TOLLGATE_TEST_REAL_AWS").is_some(),
        "no DynamoDB endpoint: run `make test` (it starts DynamoDB Local) or set AWS_ENDPOINT_URL"
    );
    let config = aws_config::load_from_env().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let prefix =
        std::env::var("TOLLGATE_TEST_TABLE_PREFIX").unwrap_or_else(|_| "tollgate-test-".into());
    let tables = Tables::with_prefix(&prefix);
    tollgate_store::schema::ensure_tables(&client, &tables)
        .await
        .expect("tables");
    Arc::new(DynamoStore::new(client, tables))
}

tollgate_store::contract_suite!(dynamo_store());
