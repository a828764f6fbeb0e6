use cairn_backend::{validate_name, Backend, Capabilities, Error, ErrorKind, ObjectInfo, Result};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Objects in memory, behind one lock (puts replace whole objects, so a
/// reader sees the old or the new object, never a mix).
#[derive(Default)]
pub struct MemoryBackend {
    objects: RwLock<BTreeMap<String, Arc<Vec<u8>>>>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces an object's bytes behind the store's back (corruption tests).
    pub fn tamper(&self, name: &str, f: impl FnOnce(&mut Vec<u8>)) {
        let mut objects = self.objects.write();
        let o = objects.get_mut(name).unwrap_or_else(|| panic!("no object {name} to tamper with"));
        f(Arc::make_mut(o));
    }

    fn object(&self, name: &str) -> Result<Arc<Vec<u8>>> {
        validate_name(name)?;
        self.objects
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("object {name} does not exist")).with_object(name))
    }
}

/// An object's tag: a hash of its bytes.
fn tag_of(data: &[u8]) -> String {
    blake3::hash(data).to_hex()[..32].to_string()
}

impl Backend for MemoryBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        validate_name(name)?;
        self.objects.write().insert(name.to_string(), Arc::new(data.to_vec()));
        Ok(())
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        validate_name(name)?;
        let mut objects = self.objects.write();
        if objects.contains_key(name) {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("object {name} already exists")).with_object(name));
        }
        objects.insert(name.to_string(), Arc::new(data.to_vec()));
        Ok(())
    }

    fn conditional_updates(&self) -> bool {
        true
    }

    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        let o = self.object(name)?;
        Ok((o.as_ref().clone(), tag_of(&o)))
    }

    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        validate_name(name)?;
        let mut objects = self.objects.write();
        match objects.get(name) {
            Some(o) if tag_of(o) == tag => {}
            _ => return Err(Error::new(ErrorKind::Changed, format!("object {name} was replaced or deleted (tag {tag} no longer matches)")).with_object(name)),
        }
        objects.insert(name.to_string(), Arc::new(data.to_vec()));
        Ok(tag_of(data))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let o = self.object(name)?;
        let end = offset.checked_add(len).filter(|e| *e <= o.len() as u64).ok_or_else(|| {
            Error::new(ErrorKind::OutOfRange, format!("object {name}: range {offset}+{len} past its end ({} bytes)", o.len())).with_object(name)
        })?;
        Ok(o[offset as usize..end as usize].to_vec())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        Ok(self.object(name)?.as_ref().clone())
    }

    fn size(&self, name: &str) -> Result<u64> {
        Ok(self.object(name)?.len() as u64)
    }

    fn delete(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        self.objects.write().remove(name);
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        Ok(self
            .objects
            .read()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ObjectInfo { name: k.clone(), size: v.len() as u64 })
            .collect())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::LOCAL
    }

    fn describe(&self) -> String {
        "memory:".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        cairn_backend::conformance::run_all(&MemoryBackend::new());
    }
}
