//! The objects that could not be restored when the server started: set
//! aside so that the rest could be, shown in
//! `weir_catalog.restore_errors`, and still droppable.

/// Why objects could not be restored, by catalog id.
#[derive(Debug, Default)]
pub struct RestoreErrors(std::sync::Mutex<std::collections::BTreeMap<u64, RestoreError>>);

/// An object set aside at start-up.
#[derive(Debug, Clone)]
pub struct RestoreError {
    pub name: Option<String>,
    pub kind: &'static str,
    pub error: String,
    pub at: std::time::SystemTime,
}

impl RestoreErrors {
    /// Sets the object `id` aside with `error`.
    pub fn record(&self, id: u64, name: Option<&str>, kind: &'static str, error: String) {
        tracing::error!(id, name, kind, error = %error, "could not restore this object; it is set aside and can be dropped");
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id,
            RestoreError {
                name: name.map(str::to_string),
                kind,
                error,
                at: std::time::SystemTime::now(),
            },
        );
    }

    /// Why the object `id` was set aside, if it was.
    pub fn get(&self, id: u64) -> Option<RestoreError> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Every object set aside, by id.
    pub fn all(&self) -> Vec<(u64, RestoreError)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, e)| (*id, e.clone()))
            .collect()
    }

    /// Forgets dropped objects.
    pub fn remove(&self, ids: &[u64]) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            all.remove(id);
        }
    }
}
