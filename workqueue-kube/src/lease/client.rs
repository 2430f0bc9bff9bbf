//! A small client of `coordination.k8s.io/v1` Leases: the four calls the protocol needs, with
//! the answers it branches on as values and the rest as errors.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};

/// What a [`LeaseClient`] call failed with: the answers the protocol does not branch on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The request failed: the API server's error status, or the transport's error.
    #[error("the Lease request failed: {0}")]
    Api(#[from] kube::Error),
    /// No answer in time (the protocol gives each request its retry period).
    #[error("the Lease request got no answer within {0:?}")]
    TimedOut(Duration),
    /// [`LeaseClient::replace`] of a Lease without `metadata.resourceVersion`: a Lease is
    /// replaced only under the version it was read at.
    #[error("Lease {0:?} has no resourceVersion: replace a Lease read from the API server")]
    NoResourceVersion(String),
    /// A Lease without `metadata.name`.
    #[error("the Lease has no metadata.name")]
    NoName,
}

/// The outcome of [`LeaseClient::create`].
#[derive(Clone, Debug, PartialEq)]
pub enum Created {
    /// Created: the stored Lease.
    Created(Box<Lease>),
    /// A Lease of that name exists (409 `AlreadyExists`).
    Exists,
}

/// The outcome of [`LeaseClient::replace`].
#[derive(Clone, Debug, PartialEq)]
pub enum Replaced {
    /// Replaced: the stored Lease, with its new resourceVersion.
    Replaced(Box<Lease>),
    /// The Lease changed since the given resourceVersion (409 `Conflict`), or is gone.
    Conflict,
}

/// The outcome of [`LeaseClient::delete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// Deleted.
    Deleted,
    /// It changed since the given resourceVersion (409 `Conflict`): not deleted.
    Conflict,
    /// It did not exist.
    NotFound,
}

/// Leases of one namespace, through one `kube::Client`.
#[derive(Clone)]
pub struct LeaseClient {
    api: Api<Lease>,
}

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClient").finish_non_exhaustive()
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == code)
}

impl LeaseClient {
    /// A client of the Leases of `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        LeaseClient {
            api: Api::namespaced(client, namespace),
        }
    }

    /// The Lease `name`, `None` if it does not exist.
    pub async fn get(&self, name: &str) -> Result<Option<Lease>, LeaseError> {
        Ok(self.api.get_opt(name).await?)
    }

    /// The Leases whose labels match `selector` (a label selector, as `kubectl -l` takes).
    pub async fn list(&self, selector: &str) -> Result<Vec<Lease>, LeaseError> {
        let params = ListParams::default().labels(selector);
        Ok(self.api.list(&params).await?.items)
    }

    /// Creates `lease` (its resourceVersion must be unset).
    pub async fn create(&self, lease: &Lease) -> Result<Created, LeaseError> {
        match self.api.create(&PostParams::default(), lease).await {
            Ok(stored) => Ok(Created::Created(Box::new(stored))),
            Err(e) if is_status(&e, 409) => Ok(Created::Exists),
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces the Lease with `lease` if it is still at `lease`'s resourceVersion.
    pub async fn replace(&self, lease: &Lease) -> Result<Replaced, LeaseError> {
        let name = lease.metadata.name.as_deref().ok_or(LeaseError::NoName)?;
        if lease.metadata.resource_version.is_none() {
            return Err(LeaseError::NoResourceVersion(name.into()));
        }
        match self.api.replace(name, &PostParams::default(), lease).await {
            Ok(stored) => Ok(Replaced::Replaced(Box::new(stored))),
            // 404: deleted since (a replace under a resourceVersion does not create it).
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(Replaced::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the Lease `name` if it is still at `resource_version`.
    pub async fn delete(&self, name: &str, resource_version: &str) -> Result<Deleted, LeaseError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(resource_version.into()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(name, &params).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(e) if is_status(&e, 409) => Ok(Deleted::Conflict),
            Err(e) if is_status(&e, 404) => Ok(Deleted::NotFound),
            Err(e) => Err(e.into()),
        }
    }
}
