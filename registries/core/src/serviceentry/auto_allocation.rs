//! ServiceEntry address auto-allocation, Istio's legacy (v1) algorithm
//! (`pilot/pkg/serviceregistry/serviceentry/auto_allocation.go`): a ServiceEntry
//! service without addresses, whose host is not a wildcard and whose resolution is not
//! NONE, gets a deterministic `240.240.<a>.<b>` and `2001:2::f0f0:<hex>` address. Every
//! istiod computes the same addresses from the same set of services; they only mean
//! something to proxies that capture DNS and ask for them (see
//! `Service::address_for_proxy`).
//!
//! The slot of a service is FNV-1a-32 of `"<namespace>/<hostname>"` modulo 65024;
//! on a collision, double hashing `(h + i·(65011 − h mod 65011)) mod 65023` for
//! i = 1, 2, … (32-bit wrapping arithmetic, as Go's `uint32`). Slots are then walked in
//! order with a counter x incremented per slot; at an occupied slot, x is bumped once
//! more when x mod 255 = 0 (so no address ends in `.0`), and the service gets
//! `240.240.<x / 255>.<x mod 255>` and `2001:2::f0f0:<x/255 as hex><x mod 255 as hex>`
//! (the third octet left out when 0). A key seen in several slots keeps the first
//! slot's addresses.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::model::{Resolution, Service};

const PRIME: u32 = 65011;
const MAX_IPS: u32 = 256 * 254;

/// Whether `service` gets an allocated address: no VIP, a non-wildcard host and a
/// resolution other than NONE.
pub fn eligible(service: &Service) -> bool {
    service.cluster_vips.values().all(Vec::is_empty)
        && !service.hostname.as_str().starts_with('*')
        && service.resolution != Resolution::Passthrough
}

/// FNV-1a, 32 bits.
fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The addresses of the octet pair `(a, b)`.
pub fn addresses(a: u32, b: u32) -> (Ipv4Addr, Ipv6Addr) {
    let v4 = Ipv4Addr::new(240, 240, a as u8, b as u8);
    let tail = if a == 0 {
        format!("{b:x}")
    } else {
        format!("{a:x}{b:x}")
    };
    let v6 = format!("2001:2::f0f0:{tail}")
        .parse()
        .expect("a valid IPv6 address");
    (v4, v6)
}

/// Sets `auto_allocated_ipv4`/`ipv6` on the eligible services (visited in the given
/// order, which decides who wins a collision) and clears them on the others.
pub fn allocate<'a>(services: impl IntoIterator<Item = &'a mut Service>) {
    let mut slots: Vec<Option<&'a mut Service>> = (0..MAX_IPS).map(|_| None).collect();
    let mut placed = 0u32;
    for service in services {
        service.auto_allocated_ipv4 = None;
        service.auto_allocated_ipv6 = None;
        if !eligible(service) {
            continue;
        }
        if placed >= MAX_IPS {
            tracing::error!("out of addresses to allocate for ServiceEntries (max {MAX_IPS})");
            break;
        }
        let key = format!("{}/{}", service.namespace, service.hostname);
        let s = fnv1a32(key.as_bytes());
        let mut slot = s % MAX_IPS;
        if slots[slot as usize].is_some() {
            let second = PRIME - (s % PRIME);
            let mut i: u32 = 1;
            loop {
                slot = s.wrapping_add(i.wrapping_mul(second)) % (MAX_IPS - 1);
                if slots[slot as usize].is_none() {
                    break;
                }
                i += 1;
            }
        }
        slots[slot as usize] = Some(service);
        placed += 1;
    }
    let mut x: u32 = 0;
    // A key met again (several services of one host and namespace) keeps its pair.
    let mut by_key: std::collections::HashMap<String, (u32, u32)> = Default::default();
    for service in slots.into_iter() {
        x += 1;
        let Some(service) = service else {
            continue;
        };
        if x.is_multiple_of(255) {
            x += 1;
        }
        let key = format!("{}/{}", service.namespace, service.hostname);
        let (a, b) = *by_key.entry(key).or_insert((x / 255, x % 255));
        let (v4, v6) = addresses(a, b);
        service.auto_allocated_ipv4 = Some(v4);
        service.auto_allocated_ipv6 = Some(v6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterId, ProviderId};

    fn se(host: &str, ns: &str) -> Service {
        let mut s = Service::new(host, ns, ProviderId::External, "c1");
        s.resolution = Resolution::DnsLb;
        s
    }

    fn allocated(mut services: Vec<Service>) -> Vec<Option<(String, String)>> {
        allocate(services.iter_mut());
        services
            .iter()
            .map(|s| {
                Some((
                    s.auto_allocated_ipv4?.to_string(),
                    s.auto_allocated_ipv6?.to_string(),
                ))
            })
            .collect()
    }

    fn pair(v4: &str, v6: &str) -> Option<(String, String)> {
        Some((v4.to_string(), v6.to_string()))
    }

    /// Istio's Test_legacyAutoAllocateIP_* vectors (reference §3.8).
    #[test]
    fn istio_vectors() {
        assert_eq!(
            allocated(vec![se("foo.com", "")]),
            [pair("240.240.227.81", "2001:2::f0f0:e351")]
        );
        let got = allocated(vec![se("a.example.com", "a"), se("a.example.com", "b")]);
        assert_eq!(got[0].as_ref().unwrap().0, "240.240.134.206");
        assert_eq!(got[1].as_ref().unwrap().0, "240.240.41.100");
        assert_eq!(
            allocated(vec![
                se("a17061.example.com", ""),
                se("a44155.example.com", "")
            ]),
            [
                pair("240.240.25.11", "2001:2::f0f0:19b"),
                pair("240.240.31.17", "2001:2::f0f0:1f11"),
            ]
        );
    }

    #[test]
    fn only_services_without_addresses_wildcards_or_passthrough() {
        let mut with_vip = se("vip.example.com", "ns");
        with_vip
            .cluster_vips
            .insert(ClusterId::new("c1"), vec!["10.0.0.1".parse().unwrap()]);
        let wildcard = se("*.example.com", "ns");
        let mut passthrough = se("none.example.com", "ns");
        passthrough.resolution = Resolution::Passthrough;
        let mut static_ = se("static.example.com", "ns");
        static_.resolution = Resolution::ClientSideLb;
        let got = allocated(vec![with_vip, wildcard, passthrough, static_]);
        assert_eq!(got[..3], [None, None, None]);
        assert!(got[3].is_some(), "STATIC without addresses is allocated");
    }

    #[test]
    fn collisions_take_the_next_free_slot_and_no_address_ends_in_zero() {
        // The same key twice takes two slots but keeps one address, as in Istio.
        let got = allocated(vec![se("x.example.com", "ns"), se("x.example.com", "ns")]);
        assert_eq!(got[0], got[1]);
        let many: Vec<Service> = (0..2000)
            .map(|i| se(&format!("h{i}.example.com"), "ns"))
            .collect();
        let got = allocated(many);
        let v4: std::collections::BTreeSet<String> =
            got.iter().map(|p| p.as_ref().unwrap().0.clone()).collect();
        assert_eq!(v4.len(), 2000, "every address is distinct");
        assert!(v4.iter().all(|a| !a.ends_with(".0")));
    }
}
