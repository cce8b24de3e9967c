//! Where WorkloadEntries are read and written: [`EntryStore`]. Reads come from a
//! cache (a config store's view, as Istio reads its informers) and never wait;
//! writes go to the owner of the objects (the API server in Kubernetes, the
//! in-memory config store outside it) with Kubernetes' optimistic concurrency: an
//! update names the `resourceVersion` it read and fails with
//! [`WriteError::Conflict`] when the object moved on.

use std::fmt;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use meshfed_registry::config::{ConfigObject, ConfigStore, Kind, MemoryConfigStore};

/// Why a write failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The object does not exist (update, status, delete).
    #[error("not found")]
    NotFound,
    /// An object of that name exists (create).
    #[error("already exists")]
    AlreadyExists,
    /// The object changed since it was read (its resourceVersion moved on).
    #[error("conflict: the object has been modified")]
    Conflict,
    /// Anything else (the API server refused or could not be reached).
    #[error("{0}")]
    Other(String),
}

/// WorkloadEntries as the controller reads and writes them.
pub trait EntryStore: Send + Sync + fmt::Debug {
    /// One entry from the cache.
    fn entry(&self, namespace: &str, name: &str) -> Option<Arc<ConfigObject>>;
    /// Every entry in the cache.
    fn entries(&self) -> Vec<Arc<ConfigObject>>;
    /// Creates `obj`.
    fn create(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>>;
    /// Replaces the metadata and spec of `obj` (its `resource_version`, when set, is
    /// the precondition).
    fn update(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>>;
    /// Replaces the status conditions of `obj` (the `status` subresource).
    fn update_status(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>>;
    /// Deletes an entry, if still at `resource_version` (when not empty).
    fn delete<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), WriteError>>;
}

/// Entries kept in the server's in-memory config store (outside Kubernetes): they
/// reach the ServiceEntry registry, `/debug/configz` and `/debug/registryz` like any
/// WorkloadEntry. Resource versions are a counter of this store's writes.
#[derive(Clone, Debug)]
pub struct MemoryEntryStore {
    store: MemoryConfigStore,
    /// Serializes writes (read, compare, apply) and counts them.
    writes: Arc<Mutex<u64>>,
}

impl MemoryEntryStore {
    /// Entries in `store`.
    pub fn new(store: MemoryConfigStore) -> MemoryEntryStore {
        MemoryEntryStore {
            store,
            writes: Arc::new(Mutex::new(0)),
        }
    }

    /// Applies `write` to the current object under the write lock.
    fn write(
        &self,
        namespace: &str,
        name: &str,
        write: impl FnOnce(Option<&ConfigObject>, u64) -> Result<Option<ConfigObject>, WriteError>,
    ) -> Result<(), WriteError> {
        let mut counter = self.writes.lock().expect("entry store poisoned");
        let current = self.store.get(Kind::WorkloadEntry, namespace, name);
        *counter += 1;
        match write(current.as_deref(), *counter)? {
            Some(obj) => self.store.apply(obj).map(|_| ()).map_err(|errors| {
                WriteError::Other(
                    errors
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            }),
            None => {
                self.store.delete(Kind::WorkloadEntry, namespace, name);
                Ok(())
            }
        }
    }
}

fn precondition(current: &ConfigObject, wanted: &str) -> Result<(), WriteError> {
    if !wanted.is_empty() && wanted != current.resource_version {
        return Err(WriteError::Conflict);
    }
    Ok(())
}

impl EntryStore for MemoryEntryStore {
    fn entry(&self, namespace: &str, name: &str) -> Option<Arc<ConfigObject>> {
        self.store.get(Kind::WorkloadEntry, namespace, name)
    }

    fn entries(&self) -> Vec<Arc<ConfigObject>> {
        self.store.list(Kind::WorkloadEntry)
    }

    fn create(&self, mut obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>> {
        let namespace = obj.namespace.clone();
        let name = obj.name.clone();
        let result = self.write(&namespace, &name, |current, version| {
            if current.is_some() {
                return Err(WriteError::AlreadyExists);
            }
            obj.resource_version = version.to_string();
            obj.conditions.clear();
            Ok(Some(obj))
        });
        Box::pin(std::future::ready(result))
    }

    fn update(&self, mut obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>> {
        let namespace = obj.namespace.clone();
        let name = obj.name.clone();
        let result = self.write(&namespace, &name, |current, version| {
            let current = current.ok_or(WriteError::NotFound)?;
            precondition(current, &obj.resource_version)?;
            obj.resource_version = version.to_string();
            // Status is written through its own call only.
            obj.conditions = current.conditions.clone();
            Ok(Some(obj))
        });
        Box::pin(std::future::ready(result))
    }

    fn update_status(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>> {
        let result = self.write(&obj.namespace, &obj.name, |current, version| {
            let current = current.ok_or(WriteError::NotFound)?;
            precondition(current, &obj.resource_version)?;
            let mut next = current.clone();
            next.resource_version = version.to_string();
            next.conditions = obj.conditions.clone();
            Ok(Some(next))
        });
        Box::pin(std::future::ready(result))
    }

    fn delete<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), WriteError>> {
        let result = self.write(namespace, name, |current, _| {
            let current = current.ok_or(WriteError::NotFound)?;
            precondition(current, resource_version)?;
            Ok(None)
        });
        Box::pin(std::future::ready(result))
    }
}

/// Finds WorkloadGroups in every config store the server reads (the first store
/// that has one wins).
#[derive(Clone, Debug, Default)]
pub struct Groups {
    stores: Vec<Arc<dyn ConfigStore>>,
}

impl Groups {
    /// Groups from `stores`.
    pub fn new(stores: Vec<Arc<dyn ConfigStore>>) -> Groups {
        Groups { stores }
    }

    /// The group `namespace/name`, if any store has it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<ConfigObject>> {
        self.stores.iter().find_map(|s| {
            s.list(Kind::WorkloadGroup)
                .into_iter()
                .find(|g| g.namespace == namespace && g.name == name)
        })
    }

    /// Every group by (namespace, name). Held, the objects tell a group deleted and
    /// created again (or changed) from the same one: another object
    /// ([`Arc::ptr_eq`]).
    pub fn versions(&self) -> std::collections::BTreeMap<(String, String), Arc<ConfigObject>> {
        self.stores
            .iter()
            .flat_map(|s| s.list(Kind::WorkloadGroup))
            .map(|g| ((g.namespace.clone(), g.name.clone()), g))
            .collect()
    }

    /// The stores' change counters, to learn when groups may have changed.
    pub fn changes(&self) -> Vec<tokio::sync::watch::Receiver<u64>> {
        self.stores.iter().filter_map(|s| s.changes()).collect()
    }
}

/// Entries in Kubernetes: read from the config store's view of the API server,
/// written through it ([`meshfed_kube::WorkloadEntryWriter`], in the version the
/// store found served).
#[derive(Clone)]
pub struct KubeEntryStore {
    view: meshfed_kube::KubeConfigStore,
    client: meshfed_kube::Client,
}

impl fmt::Debug for KubeEntryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeEntryStore").finish_non_exhaustive()
    }
}

impl KubeEntryStore {
    /// Entries of the cluster `view` follows, written with `client`.
    pub fn new(
        view: meshfed_kube::KubeConfigStore,
        client: meshfed_kube::Client,
    ) -> KubeEntryStore {
        KubeEntryStore { view, client }
    }

    fn writer(&self) -> meshfed_kube::WorkloadEntryWriter {
        let version = self
            .view
            .served_version(Kind::WorkloadEntry)
            .unwrap_or("v1");
        meshfed_kube::WorkloadEntryWriter::new(self.client.clone(), version)
    }
}

fn from_kube(e: meshfed_kube::EntryWriteError) -> WriteError {
    use meshfed_kube::EntryWriteError as E;
    match e {
        E::NotFound => WriteError::NotFound,
        E::AlreadyExists => WriteError::AlreadyExists,
        E::Conflict => WriteError::Conflict,
        E::Other(e) => WriteError::Other(e),
    }
}

impl EntryStore for KubeEntryStore {
    fn entry(&self, namespace: &str, name: &str) -> Option<Arc<ConfigObject>> {
        self.view.get(Kind::WorkloadEntry, namespace, name)
    }

    fn entries(&self) -> Vec<Arc<ConfigObject>> {
        self.view.list(Kind::WorkloadEntry)
    }

    fn create(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>> {
        Box::pin(async move { self.writer().create(&obj).await.map_err(from_kube) })
    }

    fn update(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>> {
        Box::pin(async move { self.writer().replace(&obj).await.map_err(from_kube) })
    }

    fn update_status(&self, obj: ConfigObject) -> BoxFuture<'_, Result<(), WriteError>> {
        Box::pin(async move { self.writer().replace_status(&obj).await.map_err(from_kube) })
    }

    fn delete<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<(), WriteError>> {
        Box::pin(async move {
            self.writer()
                .delete(namespace, name, resource_version)
                .await
                .map_err(from_kube)
        })
    }
}
