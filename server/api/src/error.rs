//! One error type with tiers.
//!
//! - **User-facing**: a stable [`ErrorCode`] plus safe typed fields; goes on the wire as is.
//! - **Infrastructure**: mapped once — pool exhausted or database down → `unavailable`.
//! - **Internal**: anything else is logged here with detail and goes out as `internal`
//!   with no detail (no SQL, provider bodies or stack traces on the wire).

use berth_protocol::{ErrorCode, RpcError};
use berth_store::StoreError;

#[derive(Debug)]
pub struct ApiError(pub RpcError);

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn code(code: ErrorCode) -> ApiError {
        ApiError(RpcError::new(code))
    }

    pub fn with(code: ErrorCode, fields: serde_json::Value) -> ApiError {
        let map = match fields {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        ApiError(RpcError::with_fields(code, map))
    }

    pub fn data_code(&self) -> &str {
        self.0.data_code().unwrap_or("internal")
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let code = e.code();
        match code {
            ErrorCode::Internal => tracing::error!(error = %berth_store::error_chain(&e), "internal store error"),
            ErrorCode::Unavailable => tracing::warn!(error = %berth_store::error_chain(&e), "database unavailable"),
            _ => {}
        }
        ApiError::code(code)
    }
}

impl From<ErrorCode> for ApiError {
    fn from(c: ErrorCode) -> ApiError {
        ApiError::code(c)
    }
}
