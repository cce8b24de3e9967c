//! The registry kinds this server is built with: the one list a new registry crate is
//! added to. `meshfed discovery` takes every kind's flags and log scopes from here,
//! and `--registries` chooses among them by name (see
//! [`meshfed_registry::source::RegistryKind`]).

use meshfed_registry::source::RegistryKind;

/// Every registry kind, in the order `--registries` lists them in its messages.
pub static KINDS: &[&dyn RegistryKind] = &[
    &meshfed_kube::KubeKind,
    &meshfed_consul::ConsulKind,
    &meshfed_registry::source::MockKind,
    &meshfed_nacos::NacosKind,
    &meshfed_eureka::EurekaKind,
];

/// The kind `name` selects in `--registries` (its name as written, or in lower case).
pub fn kind(name: &str) -> Option<&'static dyn RegistryKind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.name() == name || k.name().to_lowercase() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_found_by_name_and_lower_case_name() {
        assert_eq!(kind("Kubernetes").map(|k| k.name()), Some("Kubernetes"));
        assert_eq!(kind("consul").map(|k| k.name()), Some("Consul"));
        assert_eq!(kind("mock").map(|k| k.name()), Some("Mock"));
        assert_eq!(kind("eureka").map(|k| k.name()), Some("Eureka"));
        assert!(kind("MOCK").is_none());
        assert_eq!(kind("nacos").map(|k| k.name()), Some("Nacos"));
        assert!(kind("Zookeeper").is_none());
    }

    #[test]
    fn every_kinds_flags_fit_in_one_command() {
        // Two kinds defining the same flag or argument id would panic here.
        let cmd = KINDS
            .iter()
            .fold(clap::Command::new("t"), |cmd, k| k.augment_args(cmd));
        cmd.debug_assert();
    }
}
