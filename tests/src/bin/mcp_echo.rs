//! `tollgate-mcp-echo`: a small MCP server on stdio for the gateway's benchmark and tests
//! (loopback only, nothing to install). Tools:
//! - `echo {text}` answers the text (annotated read-only);
//! - `append {path, line}` appends a line to a file (a mutation a test can count);
//! - `hang` never answers (a call whose outcome is unknown);
//! - `crash` exits the process (an upstream that dies).

use std::io::Write;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};

#[derive(Clone)]
struct Echo;

fn schema(props: Value, required: &[&str]) -> Arc<Map<String, Value>> {
    let Value::Object(m) = json!({"type": "object", "properties": props, "required": required})
    else {
        unreachable!()
    };
    Arc::new(m)
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "echo",
            "Answers the text it is given.",
            schema(json!({"text": {"type": "string"}}), &["text"]),
        )
        .with_annotations(ToolAnnotations::default().read_only(true)),
        Tool::new(
            "append",
            "Appends a line to a file.",
            schema(
                json!({"path": {"type": "string"}, "line": {"type": "string"}}),
                &["path", "line"],
            ),
        ),
        Tool::new("hang", "Never answers.", schema(json!({}), &[])),
        Tool::new("crash", "Exits the server.", schema(json!({}), &[])),
    ]
}

fn text(v: &Map<String, Value>, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info.name = "tollgate-mcp-echo".into();
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(text(&args, "text"))]),
            "append" => {
                let path = text(&args, "path");
                let line = text(&args, "line");
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| writeln!(f, "{line}"));
                match written {
                    Ok(()) => CallToolResult::success(vec![ContentBlock::text("appended")]),
                    Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
                }
            }
            "hang" => std::future::pending().await,
            "crash" => std::process::exit(3),
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(result.into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let running = Echo.serve(rmcp::transport::io::stdio_pipes()).await?;
    running.waiting().await?;
    std::process::exit(0)
}
