//! Config status as Istio writes it (`PILOT_ENABLE_STATUS`): `status.conditions`
//! (the `Reconciled` condition), `status.validationMessages` and
//! `status.observedGeneration` on the Istio config objects read from this cluster,
//! written through the status subresource by the leader only, rate limited as Istio's
//! status client is (`PILOT_STATUS_QPS`, `PILOT_STATUS_BURST`), every
//! `PILOT_STATUS_UPDATE_INTERVAL`, and never when nothing would change.
//!
//! What to write comes from the server as a [`DesiredStatuses`] map (object → its
//! [`DesiredStatus`]); [`run_status_writer`] only compares and writes. The shape is
//! Istio's `istio.meta.v1alpha1.IstioStatus`:
//!
//! ```yaml
//! status:
//!   conditions:
//!   - type: Reconciled
//!     status: "True"
//!     lastProbeTime: "2026-01-01T00:00:00Z"
//!     lastTransitionTime: "2026-01-01T00:00:00Z"
//!     message: 3/3 proxies up to date.
//!   validationMessages:
//!   - type: {name: SchemaValidationError, code: IST0106}
//!     level: ERROR
//!     documentationUrl: https://istio.io/latest/docs/reference/config/analysis/ist0106/
//!   observedGeneration: "2"
//! ```

mod gateway_api;
mod merge;
mod rate;
mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;

use meshfed_registry::config::ObjectId;
use serde::Serialize;

pub use gateway_api::merged_gateway_status;
pub use merge::merged_status;
pub use rate::TokenBucket;
pub use writer::{StatusSettings, StatusStats, StatusWriter, run_status_writer};

/// The severity of a validation message (Istio's `AnalysisMessageBase.Level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Level {
    Error,
    Warning,
    Info,
}

impl Level {
    /// The proto3-JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "ERROR",
            Level::Warning => "WARNING",
            Level::Info => "INFO",
        }
    }
}

/// One entry of `status.validationMessages`: an analysis message type (Istio's
/// `IST0xxx` code and name), its level and documentation page. Analyzers and
/// validation both produce these.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ValidationMessage {
    /// `IST0106`, ...
    pub code: String,
    /// `SchemaValidationError`, ...
    pub name: String,
    pub level: Level,
    /// `https://istio.io/latest/docs/reference/config/analysis/<code lowercased>/`.
    pub documentation_url: String,
}

impl ValidationMessage {
    /// A message of Istio's catalogue, with its documentation page.
    pub fn istio(code: &str, name: &str, level: Level) -> ValidationMessage {
        ValidationMessage {
            code: code.to_string(),
            name: name.to_string(),
            level,
            documentation_url: format!(
                "https://istio.io/latest/docs/reference/config/analysis/{}/",
                code.to_ascii_lowercase()
            ),
        }
    }
}

/// How many connected proxies are up to date with an object (Istio's distribution
/// `Progress`): `Reconciled` is `True` when all are, its message `N/M proxies up to
/// date.`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Progress {
    pub acked: usize,
    pub total: usize,
}

/// What the server wants an object's status to say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DesiredStatus {
    /// The `Reconciled` condition; `None` leaves any there as it is.
    pub reconciled: Option<Progress>,
    /// Every validation message, sorted (written as `validationMessages`; empty
    /// removes the field).
    pub messages: Vec<ValidationMessage>,
    /// For a Gateway API object: the Gateway API status the translation computed (as
    /// JSON text), written instead of Istio's shape (`reconciled` and `messages` are
    /// then unused), with the controller name owning its route parent entries.
    pub gateway_api: Option<(String, String)>,
}

/// The desired status of every object, as the server last computed it.
pub type DesiredStatuses = Arc<BTreeMap<ObjectId, DesiredStatus>>;
