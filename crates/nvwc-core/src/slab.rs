//! A minimal slab: dense `u32` keys with reuse.

/// Values addressed by `u32` keys that are reused after removal.
#[derive(Debug)]
pub struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Insert a value, returning its key.
    pub fn insert(&mut self, v: T) -> u32 {
        self.len += 1;
        if let Some(k) = self.free.pop() {
            self.items[k as usize] = Some(v);
            k
        } else {
            self.items.push(Some(v));
            (self.items.len() - 1) as u32
        }
    }
    /// Remove a value. Caller guarantees `k` is present.
    pub fn remove(&mut self, k: u32) -> T {
        let v = self.items[k as usize].take().expect("slab key not present");
        self.free.push(k);
        self.len -= 1;
        v
    }
    pub fn get(&self, k: u32) -> &T {
        self.items[k as usize]
            .as_ref()
            .expect("slab key not present")
    }
    pub fn get_mut(&mut self, k: u32) -> &mut T {
        self.items[k as usize]
            .as_mut()
            .expect("slab key not present")
    }
    /// Present values with their keys, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k as u32, v)))
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
