//! One module per area of the admin API; each turns a parsed subcommand into calls and output.
//! Inputs are validated (and files read) before the first call.

pub mod checkpoint;
pub mod cluster;
pub mod job;
pub mod savepoint;

use std::io::Write;

use serde::Serialize;

use crate::cli::Output;
use crate::client::Session;
use crate::errors::CtlError;

/// What a command needs: the cluster session, the output format and sink, the request id.
pub struct Ctx<'a> {
    pub session: Session,
    pub output: Output,
    /// Sent with every mutating call of this invocation, and reused by the client's retries.
    pub request_id: String,
    pub out: &'a mut dyn Write,
}

impl Ctx<'_> {
    /// Prints `value` as JSON, or as the text `table` renders from it.
    pub fn emit<T: Serialize>(
        &mut self,
        value: &T,
        table: impl FnOnce(&T) -> String,
    ) -> Result<(), CtlError> {
        match self.output {
            Output::Json => {
                let text = serde_json::to_string_pretty(value)
                    .map_err(|e| CtlError::Internal(format!("cannot encode the reply as JSON: {e}")))?;
                writeln!(self.out, "{text}")?;
            }
            Output::Table => write!(self.out, "{}", table(value))?,
        }
        self.out.flush()?;
        Ok(())
    }
}

/// A fresh request id for one invocation.
pub fn new_request_id() -> String {
    format!("cairnctl-{:016x}", rand::random::<u64>())
}
