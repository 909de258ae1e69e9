//! On-demand prices in us-east-1, free tiers ignored. Source: the AWS pricing pages of
//! each service (aws.amazon.com/{dynamodb/pricing/on-demand, sqs/pricing, lambda/pricing,
//! api-gateway/pricing}); DynamoDB's are those of its on-demand price cut effective
//! 2024-11-01, the others unchanged since well before that date.
/// The date the constants below are taken as of.
pub const AS_OF: &str = "2024-11-01";
/// DynamoDB on-demand, standard table class: $0.625 per million write request units.
pub const DYNAMODB_WRU_USD: f64 = 0.625e-6;
/// DynamoDB on-demand, standard table class: $0.125 per million read request units.
pub const DYNAMODB_RRU_USD: f64 = 0.125e-6;
/// SQS standard queue: $0.40 per million requests (each 64 KB chunk of a payload is
/// one request; timer messages are far smaller).
pub const SQS_REQUEST_USD: f64 = 0.40e-6;
/// Lambda: $0.20 per million requests.
pub const LAMBDA_REQUEST_USD: f64 = 0.20e-6;
/// Lambda on x86_64: $0.0000166667 per GB-second (arm64, the template's default, is
/// $0.0000133334: x86_64 is the upper bound).
pub const LAMBDA_GB_SECOND_USD: f64 = 0.000_016_666_7;
/// API Gateway HTTP API: $1.00 per million requests (first 300 million a month).
pub const HTTP_API_REQUEST_USD: f64 = 1.00e-6;
/// API Gateway WebSocket API: $1.00 per million messages (first billion a month; a
/// message is metered in 32 KB units, sent and received). Source:
/// aws.amazon.com/api-gateway/pricing, us-east-1.
pub const API_GATEWAY_WS_MESSAGE_USD: f64 = 1.00e-6;
/// API Gateway WebSocket API: $0.25 per million connection-minutes. Source:
/// aws.amazon.com/api-gateway/pricing, us-east-1.
pub const API_GATEWAY_WS_CONNECTION_MINUTE_USD: f64 = 0.25e-6;
