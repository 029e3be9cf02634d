//! [`PoolCharge`]: RAM a sequence holds outside the pool's blocks (a sparse cache's index,
//! sinks, recent window and cluster cache), charged to the same budget as the blocks.
//!
//! Invariant: while a charge lives, its `bytes` are counted in [`KvPool::used`]; growing it
//! past the budget fails without charging anything (the charge keeps its old size); dropping
//! it releases exactly what it holds.

use crate::{KvError, KvPool};

/// Bytes charged to a [`KvPool`]'s budget by something other than its blocks (module doc).
pub struct PoolCharge {
    pool: KvPool,
    bytes: usize,
}

impl KvPool {
    /// A charge of `bytes` against this pool's budget, or [`KvError::OutOfMemory`] (nothing
    /// charged) when they do not fit.
    pub fn charge(&self, bytes: usize) -> Result<PoolCharge, KvError> {
        self.try_charge(bytes)?;
        Ok(PoolCharge { pool: self.clone(), bytes })
    }
}

impl PoolCharge {
    /// Bytes charged now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The pool charged.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Charges `bytes` in all instead of what it held: a shrink always succeeds; a growth
    /// past the budget fails with [`KvError::OutOfMemory`] (`needed`: the growth) and keeps
    /// the old size.
    pub fn resize(&mut self, bytes: usize) -> Result<(), KvError> {
        if bytes > self.bytes {
            self.pool.try_charge(bytes - self.bytes)?;
        } else {
            self.pool.release(self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for PoolCharge {
    fn drop(&mut self) {
        self.pool.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use crate::{KvFormat, KvLayout, KvPool};

    #[test]
    fn a_charge_counts_against_the_budget_and_is_released_on_drop() {
        let pool = KvPool::new(KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 64 }, KvFormat::F16, 1000);
        let mut c = pool.charge(600).unwrap();
        assert_eq!(pool.used(), 600);
        assert!(pool.charge(500).is_err());
        assert!(c.resize(1001).is_err());
        assert_eq!((c.bytes(), pool.used()), (600, 600));
        c.resize(900).unwrap();
        assert_eq!(pool.used(), 900);
        c.resize(100).unwrap();
        assert_eq!(pool.used(), 100);
        drop(c);
        assert_eq!(pool.used(), 0);
    }
}
