//! [`Config`]: one config object of a kind, with the metadata generators need; what
//! the config index holds and delegate merging works on.

use std::collections::BTreeMap;
use std::time::SystemTime;

use meshfed_registry::config::ConfigObject;

/// One config object of a kind, with the metadata generators need.
#[derive(Clone, Debug, PartialEq)]
pub struct Config<T> {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub creation_time: SystemTime,
    pub spec: T,
}

impl<T: Clone> Config<T> {
    /// `object`'s metadata with `spec` (its spec, typed).
    pub fn of(object: &ConfigObject, spec: &T) -> Config<T> {
        Config {
            name: object.name.clone(),
            namespace: object.namespace.clone(),
            labels: object.labels.clone(),
            annotations: object.annotations.clone(),
            creation_time: object.creation_time,
            spec: spec.clone(),
        }
    }
}
