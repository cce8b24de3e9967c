//! What a simulated proxy holds of each type: per resource its name, a hash of its
//! bytes and the few facts the checks read (an EDS name, an endpoint count and
//! marker, route names, a config marker), never the decoded resource.
//!
//! With `decode: lean` (the default) nothing the proxies have in common is held per
//! proxy ([`Shared`]):
//! - the facts of a resource are decoded once per distinct resource (keyed by the
//!   hash of its bytes) and shared by every proxy that receives those bytes;
//! - a type's table (name -> hash and facts) is content-addressed: a proxy whose
//!   update leads to a table another proxy already holds takes that one, so 20,000
//!   sidecars with the same 1,000 clusters hold one table between them, and an
//!   endpoint change makes one new table that all of them move to;
//! - the names a table makes a proxy subscribe to (the EDS names of its clusters, the
//!   route names of its listeners), encoded once for SotW requests, are worked out
//!   once per table.
//!
//! With `decode: full` every proxy decodes every resource itself and builds its own
//! tables: the same checks, each proxy's decoding on its own (the tool's memory then
//! grows with proxies × resources).

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use meshfed::xds::TypeUrl;

use super::scenario::Decode;

/// What the checks read of one resource.
#[derive(Debug, PartialEq)]
pub enum Facts {
    /// A cluster and its EDS name, when it is an EDS cluster.
    Cluster(Option<Arc<str>>),
    /// A load assignment: its endpoint count and the newest change marker it carries.
    Assignment(usize, Option<u32>),
    /// A listener and the route names it uses.
    Listener(Vec<Arc<str>>),
    /// A route configuration, the clusters it sends to (proxyless only) and the newest
    /// config change its route names show.
    Route(Vec<Arc<str>>, Option<u32>),
    /// A type the tool does not follow.
    Other,
}

/// A decoded resource: its name and facts.
#[derive(Debug, PartialEq)]
pub struct Resource {
    /// The resource's name.
    pub name: Arc<str>,
    /// What the checks read of it.
    pub facts: Facts,
    /// The version a Delta response gave these bytes (the first one seen), which a
    /// Delta proxy that reconnects names in `initial_resource_versions`.
    pub version: OnceLock<Arc<str>>,
}

impl Resource {
    /// `name` with `facts`, no version known yet.
    pub fn new(name: Arc<str>, facts: Facts) -> Resource {
        Resource {
            name,
            facts,
            version: OnceLock::new(),
        }
    }
}

/// One held resource.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Hash of the resource's bytes.
    pub hash: u64,
    /// Its name and facts.
    pub resource: Arc<Resource>,
}

/// A content fingerprint: the sum over entries of two independent hashes of (name,
/// bytes hash), so it can be updated entry by entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Fingerprint(u64, u64);

impl Fingerprint {
    fn of(name: &str, hash: u64) -> Fingerprint {
        Fingerprint(FP_A.hash_one((name, hash)), FP_B.hash_one((name, hash)) | 1)
    }

    fn add(&mut self, other: Fingerprint) {
        self.0 = self.0.wrapping_add(other.0);
        self.1 = self.1.wrapping_add(other.1);
    }

    fn sub(&mut self, other: Fingerprint) {
        self.0 = self.0.wrapping_sub(other.0);
        self.1 = self.1.wrapping_sub(other.1);
    }
}

const FP_A: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x6d65_7368_6665_6401);
const FP_B: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x6c6f_6164_7461_6202);
const BYTES: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x6279_7465_7368_6103);

/// The hasher of name-keyed maps: names come from the server under test, not from an
/// adversary, so a fast unkeyed hash is enough.
pub type NameHasher = foldhash::fast::RandomState;

/// The hash of a resource's bytes.
pub fn content_hash(bytes: &[u8]) -> u64 {
    BYTES.hash_one(bytes)
}

/// A subscription's names, and the same names as every SotW request of the type
/// repeats them, encoded once as field 3 of `DiscoveryRequest`. A sidecar ACKs each
/// EDS response with all of its ~1,000 names: copying and encoding them per ACK made
/// the tool cost more CPU than the server it measures.
#[derive(Debug, Default, PartialEq)]
pub struct NameSet {
    names: BTreeSet<Arc<str>>,
    encoded: bytes::Bytes,
}

impl NameSet {
    /// The set of `names`.
    pub fn new(names: BTreeSet<Arc<str>>) -> NameSet {
        let mut encoded = Vec::new();
        for name in &names {
            prost::encoding::encode_key(
                3,
                prost::encoding::WireType::LengthDelimited,
                &mut encoded,
            );
            prost::encoding::encode_varint(name.len() as u64, &mut encoded);
            encoded.extend_from_slice(name.as_bytes());
        }
        NameSet {
            names,
            encoded: encoded.into(),
        }
    }

    /// The names, in request order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }

    /// The names as a set.
    pub fn set(&self) -> &BTreeSet<Arc<str>> {
        &self.names
    }

    /// Whether `name` is one of them.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The names as `DiscoveryRequest.resource_names` fields.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// [`NameSet::encoded`], shared: a request sends them as they are.
    pub fn encoded_bytes(&self) -> bytes::Bytes {
        self.encoded.clone()
    }
}

/// What a proxy holds of one type (see the module docs); immutable, replaced whole.
#[derive(Debug, Default)]
pub struct Table {
    /// By name, with a fast hasher: every proxy looks up every name it subscribes to
    /// when checking its config complete (20,000 proxies x 2,000 names).
    entries: HashMap<Arc<str>, Entry, NameHasher>,
    fingerprint: Fingerprint,
    /// The names this table makes the proxy subscribe to next, worked out once.
    derived: OnceLock<Arc<NameSet>>,
}

impl Table {
    /// The entry of `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Whether `name` is held.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Resources held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The names held.
    pub fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.entries.keys()
    }

    /// The entries held.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// The names the table's resources make the proxy subscribe to: `names` of every
    /// entry's facts, worked out on the first call.
    pub fn derived(&self, names: impl Fn(&Facts) -> Vec<Arc<str>>) -> Arc<NameSet> {
        self.derived
            .get_or_init(|| {
                let set = self
                    .entries
                    .values()
                    .flat_map(|e| names(&e.resource.facts))
                    .collect();
                Arc::new(NameSet::new(set))
            })
            .clone()
    }
}

/// A change to a table.
#[derive(Debug, Default)]
pub struct Update {
    /// The update is the whole content (a SotW CDS or LDS response): what it does not
    /// name is gone.
    pub complete: bool,
    /// Resources added or replaced.
    pub put: Vec<Entry>,
    /// Names removed.
    pub remove: Vec<Arc<str>>,
}

/// What [`Shared`] holds, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SharedStats {
    /// Distinct tables some proxy holds.
    pub tables: usize,
    /// Their entries, all together.
    pub entries: usize,
    /// Distinct resources decoded.
    pub resources: usize,
}

/// Tables by content, and each resource's facts by its bytes, shared by every proxy
/// of a run (see the module docs).
#[derive(Debug)]
pub struct Shared {
    decode: Decode,
    tables: Mutex<Interned>,
    facts: Mutex<HashMap<(usize, u64, usize), Arc<Resource>>>,
    empty: Arc<Table>,
}

#[derive(Debug, Default)]
struct Interned {
    by_content: HashMap<(usize, Fingerprint, usize), Weak<Table>>,
    /// Entries after the last sweep of dropped tables.
    swept: usize,
}

/// Facts of more distinct resources than this are not cached (a run has services ×
/// ports × changes of them; the bound keeps a scenario that changes much more from
/// growing the cache without end).
const MAX_CACHED_FACTS: usize = 1 << 20;

impl Shared {
    /// The shared state of a run decoding as `decode` says.
    pub fn new(decode: Decode) -> Shared {
        Shared {
            decode,
            tables: Mutex::default(),
            facts: Mutex::default(),
            empty: Arc::default(),
        }
    }

    /// How the run decodes.
    pub fn decode(&self) -> Decode {
        self.decode
    }

    /// What is shared now (lean): tables held by some proxy, their entries, and
    /// resources decoded.
    pub fn stats(&self) -> SharedStats {
        let interned = self.tables.lock().expect("table interner");
        let live: Vec<Arc<Table>> = interned
            .by_content
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        SharedStats {
            tables: live.len(),
            entries: live.iter().map(|t| t.len()).sum(),
            resources: self.facts.lock().expect("facts cache").len(),
        }
    }

    /// The empty table.
    pub fn empty(&self) -> Arc<Table> {
        self.empty.clone()
    }

    /// The entries of the resources of one response of `type_url`: each one's bytes
    /// hashed, its facts decoded by `decode` unless a proxy decoded the same bytes
    /// before (lean).
    pub fn entries<'a, E>(
        &self,
        type_url: TypeUrl,
        resources: impl Iterator<Item = &'a [u8]>,
        mut decode: impl FnMut(&[u8]) -> Result<Resource, E>,
    ) -> Result<Vec<Entry>, E> {
        let t = type_url.index();
        let mut out = Vec::new();
        match self.decode {
            Decode::Full => {
                for bytes in resources {
                    out.push(Entry {
                        hash: content_hash(bytes),
                        resource: Arc::new(decode(bytes)?),
                    });
                }
            }
            Decode::Lean => {
                let mut cache = self.facts.lock().expect("facts cache");
                for bytes in resources {
                    let hash = content_hash(bytes);
                    let key = (t, hash, bytes.len());
                    let resource = match cache.get(&key) {
                        Some(r) => r.clone(),
                        None => {
                            let r = Arc::new(decode(bytes)?);
                            if cache.len() < MAX_CACHED_FACTS {
                                cache.insert(key, r.clone());
                            }
                            r
                        }
                    };
                    out.push(Entry { hash, resource });
                }
            }
        }
        Ok(out)
    }

    /// `old` with `update` applied: a table another proxy holds with the same content
    /// when there is one (lean), else a new one.
    pub fn update(&self, type_url: TypeUrl, old: &Arc<Table>, update: Update) -> Arc<Table> {
        let (mut fingerprint, mut len) = match update.complete {
            true => (Fingerprint::default(), 0),
            false => (old.fingerprint, old.len()),
        };
        let mut touched = update.complete;
        if !update.complete {
            for name in &update.remove {
                if let Some(e) = old.get(name) {
                    fingerprint.sub(Fingerprint::of(name, e.hash));
                    len -= 1;
                    touched = true;
                }
            }
        }
        let mut names = std::collections::HashSet::with_capacity(update.put.len());
        for e in &update.put {
            let name = &e.resource.name;
            if !names.insert(name) {
                // A name twice in one update (a server bug): the last one counts.
                return self.build(type_url, old, update, None);
            }
            if !update.complete
                && let Some(held) = old.get(name)
            {
                if held.hash == e.hash {
                    continue;
                }
                fingerprint.sub(Fingerprint::of(name, held.hash));
                len -= 1;
            }
            fingerprint.add(Fingerprint::of(name, e.hash));
            len += 1;
            touched = true;
        }
        if !touched || (fingerprint == old.fingerprint && len == old.len()) {
            return old.clone();
        }
        let key = (type_url.index(), fingerprint, len);
        if self.decode == Decode::Lean
            && let Some(table) = self
                .tables
                .lock()
                .expect("table interner")
                .by_content
                .get(&key)
                .and_then(Weak::upgrade)
        {
            return table;
        }
        self.build(type_url, old, update, Some(key))
    }

    fn build(
        &self,
        type_url: TypeUrl,
        old: &Arc<Table>,
        update: Update,
        key: Option<(usize, Fingerprint, usize)>,
    ) -> Arc<Table> {
        let mut entries = match update.complete {
            true => HashMap::with_capacity_and_hasher(update.put.len(), NameHasher::default()),
            false => old.entries.clone(),
        };
        for name in &update.remove {
            entries.remove(name);
        }
        for e in update.put {
            entries.insert(e.resource.name.clone(), e);
        }
        let fingerprint = match key {
            Some((_, fingerprint, _)) => fingerprint,
            None => {
                let mut fingerprint = Fingerprint::default();
                for (name, e) in &entries {
                    fingerprint.add(Fingerprint::of(name, e.hash));
                }
                fingerprint
            }
        };
        let table = Arc::new(Table {
            entries,
            fingerprint,
            derived: OnceLock::new(),
        });
        if self.decode == Decode::Lean {
            let key = key.unwrap_or((type_url.index(), fingerprint, table.len()));
            let mut interned = self.tables.lock().expect("table interner");
            interned.by_content.insert(key, Arc::downgrade(&table));
            if interned.by_content.len() > 2 * interned.swept.max(1024) {
                interned.by_content.retain(|_, t| t.strong_count() > 0);
                interned.swept = interned.by_content.len();
            }
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(name: &str, endpoints: usize, marker: Option<u32>) -> Resource {
        Resource::new(Arc::from(name), Facts::Assignment(endpoints, marker))
    }

    /// Resources as bytes: the name, then the endpoint count and marker.
    fn bytes(name: &str, endpoints: usize, marker: Option<u32>) -> Vec<u8> {
        format!("{name}/{endpoints}/{marker:?}").into_bytes()
    }

    fn parse(b: &[u8]) -> Result<Resource, String> {
        let text = std::str::from_utf8(b).map_err(|e| e.to_string())?;
        let mut parts = text.split('/');
        let name = parts.next().ok_or("no name")?;
        let endpoints = parts
            .next()
            .ok_or("no count")?
            .parse()
            .map_err(|_| "count")?;
        let marker = match parts.next().ok_or("no marker")? {
            "None" => None,
            m => Some(
                m.trim_start_matches("Some(")
                    .trim_end_matches(')')
                    .parse()
                    .map_err(|_| "marker")?,
            ),
        };
        Ok(resource(name, endpoints, marker))
    }

    fn entries(shared: &Shared, rs: &[Vec<u8>], decoded: &mut usize) -> Vec<Entry> {
        shared
            .entries(TypeUrl::Endpoint, rs.iter().map(|b| b.as_slice()), |b| {
                *decoded += 1;
                parse(b)
            })
            .unwrap()
    }

    /// The tables of two proxies that each receive `initial` as one full EDS response.
    fn two_proxies(shared: &Shared, initial: &[Vec<u8>], decoded: &mut usize) -> Vec<Arc<Table>> {
        (0..2)
            .map(|_| {
                let put = entries(shared, initial, decoded);
                shared.update(
                    TypeUrl::Endpoint,
                    &shared.empty(),
                    Update {
                        put,
                        ..Update::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn lean_proxies_share_facts_and_tables_and_follow_a_change() {
        let shared = Shared::new(Decode::Lean);
        let initial: Vec<Vec<u8>> = (0..3).map(|i| bytes(&format!("c{i}"), 10, None)).collect();
        let mut decoded = 0;
        // Two proxies receive the same full EDS response.
        let tables = two_proxies(&shared, &initial, &mut decoded);
        assert_eq!(decoded, 3, "each distinct resource is decoded once");
        assert!(Arc::ptr_eq(&tables[0], &tables[1]), "one table for both");
        assert_eq!(
            shared.stats(),
            SharedStats {
                tables: 1,
                entries: 3,
                resources: 3
            }
        );
        assert_eq!(tables[0].len(), 3);
        // An endpoint change: c1 gets a marker. The first proxy makes the new table,
        // the second takes it; the table shows the marker.
        let changed = vec![bytes("c1", 10, Some(4))];
        let after: Vec<Arc<Table>> = tables
            .iter()
            .map(|t| {
                let put = entries(&shared, &changed, &mut decoded);
                shared.update(
                    TypeUrl::Endpoint,
                    t,
                    Update {
                        put,
                        ..Update::default()
                    },
                )
            })
            .collect();
        assert_eq!(decoded, 4);
        assert!(Arc::ptr_eq(&after[0], &after[1]));
        assert!(!Arc::ptr_eq(&after[0], &tables[0]));
        assert_eq!(
            after[0].get("c1").unwrap().resource.facts,
            Facts::Assignment(10, Some(4))
        );
        assert_eq!(
            after[0].get("c0").unwrap().resource.facts,
            Facts::Assignment(10, None)
        );
        // The same bytes again change nothing: the same table.
        let put = entries(&shared, &changed, &mut decoded);
        let same = shared.update(
            TypeUrl::Endpoint,
            &after[0],
            Update {
                put,
                ..Update::default()
            },
        );
        assert!(Arc::ptr_eq(&same, &after[0]));
        // A removal, then the complete set as it was: back to the first table.
        let removed = shared.update(
            TypeUrl::Endpoint,
            &after[0],
            Update {
                remove: vec![Arc::from("c2")],
                ..Update::default()
            },
        );
        assert_eq!(removed.len(), 2);
        let put = entries(&shared, &initial, &mut decoded);
        let back = shared.update(
            TypeUrl::Endpoint,
            &removed,
            Update {
                complete: true,
                put,
                ..Update::default()
            },
        );
        assert!(Arc::ptr_eq(&back, &tables[0]), "content-addressed");
        // Names derived from a table are worked out once and shared with it.
        let names = |f: &Facts| match f {
            Facts::Assignment(n, _) => vec![Arc::from(format!("n{n}"))],
            _ => vec![],
        };
        let d = back.derived(names);
        assert!(Arc::ptr_eq(&d, &tables[1].derived(|_| unreachable!())));
        assert_eq!(d.names().collect::<Vec<_>>(), ["n10"]);
    }

    #[test]
    fn full_decoding_shares_nothing_and_sees_the_same() {
        let shared = Shared::new(Decode::Full);
        let initial: Vec<Vec<u8>> = (0..3).map(|i| bytes(&format!("c{i}"), 10, None)).collect();
        let mut decoded = 0;
        let tables = two_proxies(&shared, &initial, &mut decoded);
        assert_eq!(decoded, 6, "every proxy decodes every resource");
        assert!(!Arc::ptr_eq(&tables[0], &tables[1]));
        let put = entries(&shared, &[bytes("c1", 10, Some(4))], &mut decoded);
        let after = shared.update(
            TypeUrl::Endpoint,
            &tables[0],
            Update {
                put,
                ..Update::default()
            },
        );
        assert_eq!(
            after.get("c1").unwrap().resource.facts,
            Facts::Assignment(10, Some(4))
        );
        assert_eq!(
            tables[0].get("c1").unwrap().resource.facts,
            Facts::Assignment(10, None)
        );
    }

    #[test]
    fn undecodable_resources_fail_the_update() {
        let shared = Shared::new(Decode::Lean);
        let err = shared
            .entries(TypeUrl::Endpoint, [b"c0".as_slice()].into_iter(), parse)
            .unwrap_err();
        assert_eq!(err, "no count");
    }

    #[test]
    fn name_sets_encode_resource_names() {
        let set = NameSet::new(["b", "a"].into_iter().map(Arc::from).collect());
        assert_eq!(set.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(set.encoded(), [26, 1, b'a', 26, 1, b'b']);
        assert!(set.contains("a") && !set.contains("c"));
    }
}
