//! How a change is recognised in what a proxy receives: an endpoint change sets an
//! endpoint's port to a marker port, a config change names a route after the change.
//! Written by the registry, checked against the scenario, read by the proxies.

/// Endpoint changes set an endpoint's port to `MARKER_BASE + change index`, so a proxy
/// recognises which change an endpoint list contains.
pub const MARKER_BASE: u16 = 20000;

/// The highest number of changes one run may make: every endpoint change gets its own
/// marker port in `MARKER_BASE..=65535`.
pub const MAX_CHANGES: usize = (u16::MAX - MARKER_BASE) as usize;

/// Config changes name the VirtualService's route `load-change-<change index>`.
pub const ROUTE_MARKER: &str = "load-change-";

/// The marker port of change `index`.
pub fn marker_port(index: usize) -> u16 {
    MARKER_BASE + u16::try_from(index).expect("change indexes are bounded by MAX_CHANGES")
}

/// The change a marker port stands for.
pub fn marker_change(port: u32) -> Option<u32> {
    (port >= u32::from(MARKER_BASE) && port <= u32::from(u16::MAX))
        .then(|| port - u32::from(MARKER_BASE))
}

/// The config change a route name stands for.
pub fn route_marker_change(name: &str) -> Option<u32> {
    name.strip_prefix(ROUTE_MARKER)?.parse().ok()
}
