//! A bearer token on every call (`authorization: Bearer <token>`): the admin token of an
//! operator, or the worker token of a worker.

use tonic::Status;
use tonic::transport::Channel;

use crate::ClientError;

/// Adds `authorization: Bearer <token>` to every request (nothing when no token is set).
#[derive(Clone)]
pub struct BearerAuth {
    header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl BearerAuth {
    pub fn new(token: Option<&str>) -> Result<Self, ClientError> {
        let header = token
            .map(|t| {
                format!("Bearer {t}").parse().map_err(|_| ClientError::BadToken {
                    reason: "it must be printable ASCII without line breaks".into(),
                })
            })
            .transpose()?;
        Ok(Self { header })
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

/// A channel that carries the admin token.
pub type AuthChannel = tonic::service::interceptor::InterceptedService<Channel, BearerAuth>;
