//! The Lambda entry points of the push functions (docs/architecture.md §9): the
//! `websocket` function answers API Gateway WebSocket events
//! (`ApiGatewayWebsocketProxyRequest`), the `fanout` function DynamoDB Stream batches.

use std::convert::Infallible;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::dynamodb::Event;
use aws_lambda_events::encodings::Body;
use axum::http::{HeaderValue, StatusCode};
use lambda_runtime::{service_fn, LambdaEvent};
use tollgate_store::dynamo::{Connections, Tables};

use super::{Fanout, Poster, Websocket};
use crate::ApiError;

pub use lambda_runtime::Error;

fn answer(status: StatusCode, body: Option<String>) -> ApiGatewayProxyResponse {
    let mut response = ApiGatewayProxyResponse::default();
    response.status_code = i64::from(status.as_u16());
    response.body = body.map(Body::Text);
    if response.body.is_some() {
        response
            .headers
            .insert("content-type", HeaderValue::from_static("application/json"));
    }
    response
}

fn refusal(err: ApiError, request_id: &str) -> ApiGatewayProxyResponse {
    let status = err.status;
    let body = serde_json::to_string(&err.body(request_id)).unwrap_or_default();
    answer(status, Some(body))
}

impl Websocket {
    /// One WebSocket event: `$connect` answers 200 (with `Sec-WebSocket-Protocol` when
    /// a subprotocol was offered) or the refusal (401, …: the upgrade fails);
    /// `$disconnect` deletes the connection; every other route is a client message,
    /// answered with frames posted to the connection (the route's own answer is 200, or
    /// 500 when storage failed).
    pub async fn handle(
        &self,
        request: ApiGatewayWebsocketProxyRequest,
    ) -> ApiGatewayProxyResponse {
        let ctx = &request.request_context;
        let connection_id = ctx.connection_id.clone().unwrap_or_default();
        let request_id = ctx.request_id.clone().unwrap_or_default();
        let route = ctx.route_key.as_deref().unwrap_or("$default");
        if connection_id.is_empty() {
            return refusal(ApiError::bad_request("no connection id"), &request_id);
        }
        let result = match route {
            "$connect" => {
                let token = request
                    .query_string_parameters
                    .first(tollgate_protocol::ws::TOKEN_QUERY);
                let run_id = request
                    .query_string_parameters
                    .first(tollgate_protocol::ws::RUN_QUERY);
                match self
                    .connect(&connection_id, &request.headers, token, run_id)
                    .await
                {
                    Ok(connected) => {
                        let mut response = answer(StatusCode::OK, None);
                        if let Some(p) = connected.subprotocol {
                            response
                                .headers
                                .insert("sec-websocket-protocol", HeaderValue::from_static(p));
                        }
                        return response;
                    }
                    Err(err) => Err(err),
                }
            }
            "$disconnect" => self.disconnect(&connection_id).await,
            _ => match self
                .poster
                .endpoint(ctx.domain_name.as_deref(), ctx.stage.as_deref())
            {
                Some(endpoint) => {
                    self.message(
                        &endpoint,
                        &connection_id,
                        request.body.as_deref(),
                        &request_id,
                    )
                    .await
                }
                None => Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "no @connections endpoint",
                )),
            },
        };
        match result {
            Ok(()) => answer(StatusCode::OK, None),
            Err(err) => {
                if err.status.is_server_error() {
                    tracing::error!(route, error = %err.error, "websocket route failed");
                }
                refusal(err, &request_id)
            }
        }
    }
}

/// The registry's table (`TOLLGATE_CONNECTIONS_TABLE`, or the prefix's) on the shared
/// SDK configuration.
async fn registry(sdk: &aws_config::SdkConfig) -> Connections {
    Connections::new(
        tollgate_store::dynamo::client(sdk),
        Tables::from_env().connections,
    )
}

/// The whole `websocket` function: JSON logs and configuration as every function
/// (`functions::start`), the registry and the `@connections` poster, then WebSocket
/// events from the Runtime API.
pub async fn run_websocket(function: &crate::functions::Function) -> Result<(), Error> {
    let deps = crate::functions::start(function).await?;
    let sdk = tollgate_store::dynamo::sdk_config().await;
    let handler = Websocket {
        runs: deps.runs.clone(),
        auth: deps.auth.clone(),
        registry: registry(&sdk).await,
        poster: Poster::from_env(sdk),
        caps: deps.sse.caps,
    };
    let handler = &handler;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<ApiGatewayWebsocketProxyRequest>| async move {
            Ok::<_, Infallible>(handler.handle(event.payload).await)
        },
    ))
    .await
}

/// The whole `fanout` function: JSON logs, the registry and the `@connections` endpoint
/// (`TOLLGATE_WEBSOCKET_ENDPOINT`, required), then stream batches from the Runtime API.
pub async fn run_fanout(function: &crate::functions::Function) -> Result<(), Error> {
    crate::telemetry::init(true);
    let sdk = tollgate_store::dynamo::sdk_config().await;
    let poster = Poster::from_env(sdk.clone());
    let Some(endpoint) = poster.fixed_endpoint().map(str::to_owned) else {
        let why = format!("{} must be set", super::post::ENDPOINT_ENV);
        tracing::error!(function = function.name, error = %why, "start-up failed");
        return Err(why.into());
    };
    let handler = Fanout {
        registry: registry(&sdk).await,
        poster,
        endpoint,
    };
    let handler = &handler;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        Ok::<_, Infallible>(handler.handle(event.payload).await)
    }))
    .await
}
