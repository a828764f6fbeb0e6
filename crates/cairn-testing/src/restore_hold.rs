//! A store whose restores take as long as the test says (see the crate docs).

use cairn_backend::{Backend, Capabilities, Error, ErrorKind, ObjectInfo, ObjectState, RestoreSpeed, RestoreState, Result, StorageClass};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Wraps a store with archive classes. While held, every object of an
/// archive class reads as a real unrestored one would, whatever the store
/// underneath did with its restore (moto completes restores at once): a
/// GET fails with [`ErrorKind::Archived`], and `restore_state` says
/// `Ongoing` once a restore was asked for through this wrapper (`None`
/// before). Released, it passes everything through. Restore requests are
/// counted (per object).
pub struct RestoreHold<B> {
    inner: B,
    held: AtomicBool,
    restores: AtomicU64,
    asked: Mutex<HashSet<String>>,
}

impl<B: Backend> RestoreHold<B> {
    /// Wraps `inner`, held or not.
    pub fn new(inner: B, held: bool) -> Self {
        RestoreHold { inner, held: AtomicBool::new(held), restores: AtomicU64::new(0), asked: Mutex::new(HashSet::new()) }
    }

    /// Holds restores (or lets them complete).
    pub fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
    }

    /// Restore requests sent through this wrapper.
    pub fn restores(&self) -> u64 {
        self.restores.load(Ordering::SeqCst)
    }

    /// Objects a restore was asked for.
    pub fn restored_objects(&self) -> usize {
        self.asked.lock().unwrap().len()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// While held: an error if `name` is archived (the inner store's class).
    fn refuse_if_archived(&self, name: &str) -> Result<()> {
        if !self.held.load(Ordering::SeqCst) {
            return Ok(());
        }
        match self.inner.restore_state(name) {
            Ok(s) if s.class.needs_restore() => Err(Error::new(ErrorKind::Archived, format!("get {name}: archived, restore held (injected)")).with_object(name)),
            _ => Ok(()),
        }
    }
}

impl<B: Backend> Backend for RestoreHold<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.inner.put(name, data)
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        self.inner.put_if_absent(name, data)
    }
    fn conditional_updates(&self) -> bool {
        self.inner.conditional_updates()
    }
    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        self.refuse_if_archived(name)?;
        self.inner.get_tagged(name)
    }
    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        self.inner.put_if_match(name, data, tag)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.refuse_if_archived(name)?;
        self.inner.get_range(name, offset, len)
    }
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        self.refuse_if_archived(name)?;
        self.inner.get_ranges(name, ranges)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.refuse_if_archived(name)?;
        self.inner.get(name)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        format!("restore-hold:{}", self.inner.describe())
    }
    fn put_in_class(&self, name: &str, data: &[u8], class: StorageClass) -> Result<()> {
        self.inner.put_in_class(name, data, class)
    }
    fn restore(&self, name: &str, days: u32, speed: RestoreSpeed) -> Result<()> {
        self.restores.fetch_add(1, Ordering::SeqCst);
        self.asked.lock().unwrap().insert(name.to_string());
        self.inner.restore(name, days, speed)
    }
    fn restore_state(&self, name: &str) -> Result<ObjectState> {
        let s = self.inner.restore_state(name)?;
        if !self.held.load(Ordering::SeqCst) || !s.class.needs_restore() {
            return Ok(s);
        }
        let restore = if self.asked.lock().unwrap().contains(name) { RestoreState::Ongoing } else { RestoreState::None };
        Ok(ObjectState { class: s.class, restore })
    }
    fn meter(&self) -> Option<std::sync::Arc<cairn_backend::Meter>> {
        self.inner.meter()
    }
    fn sequential(&self) -> Option<&dyn cairn_backend::Sequential> {
        self.inner.sequential()
    }
}
