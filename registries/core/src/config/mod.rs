//! Istio configuration objects (`networking.istio.io`): the typed model, Istio-style
//! validation, and the stores that hold them.
//!
//! - [`kinds`]: every kind meshfed reads, declared once ([`Kind`], [`Spec`], [`kinds::KindInfo`]).
//! - [`model`]: [`ConfigObject`] (Kubernetes metadata + a typed [`Spec`]).
//! - [`decode()`]: reading Kubernetes-style objects into config objects.
//! - [`mod@validate`]: per-kind spec validation after Istio's `pkg/config/validation`,
//!   reporting every problem with its field path ([`FieldError`]) plus non-fatal
//!   [`Warning`]s; [`validation`]: whole objects ([`validate()`], metadata and spec).
//! - [`source`]: reading config files (multi-document YAML, JSON, `kind: List`) with
//!   `file:line` for every problem ([`Diagnostic`]).
//! - [`report`]: [`validate_files`], the offline check behind `meshfed validate -f`.
//! - [`store`]: the [`ConfigStore`] read trait and the in-memory [`MemoryConfigStore`].
//! - [`file_store`]: [`FileConfigStore`], fed from a watched directory by
//!   [`run_config_dir`] (`--configDir`).
//!
//! The rule every store keeps: **a bad object is rejected alone**. It never reaches the
//! store (an earlier valid version of the same object stays), it is listed by
//! [`ConfigStore::rejected`] with the reason, and everything else still applies.

pub mod decode;
pub mod file_store;
pub mod gateway_api;
pub mod ignored;
pub mod kinds;
pub mod model;
pub mod report;
pub mod secret;
pub mod source;
pub mod store;
pub mod validate;
pub mod validation;

mod assembly;
pub(crate) mod locate;
mod references;
pub mod spec_json;
mod time;
pub use time::{format_rfc3339, parse_rfc3339};

pub use decode::{Decoded, InvalidObject, SkippedObject, decode};
pub use file_store::{ConfigDirStatus, FileConfigStore, run_config_dir};
pub use ignored::IgnoredConfig;
pub use kinds::{Feeds, KindInfo, KindSpec};
pub use model::{
    Condition, ConfigObject, Kind, ObjectId, Spec, StatusAddress, supported_api_version,
};
pub use report::{Report, validate_files, validate_files_in, validate_text, validate_value};
pub use secret::{SecretData, SecretObject};
pub use source::{Diagnostic, Severity};
pub use store::{ConfigMaps, ConfigStore, MemoryConfigStore, NamespaceLabels, RejectedConfig};
pub use validate::config_sources::{
    ConfigSourceAddress, config_source_addresses, validate_config_sources,
};
pub use validate::{
    FieldError, FieldPath, Segment, Validation, Warning, validate_mesh_config,
    validate_mesh_networks,
};
pub use validation::{not_enforced, not_enforced_in, validate};
