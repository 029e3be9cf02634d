//! The little-endian byte codec of a saved sparse state: [`Enc`] appends fields, [`Dec`] reads
//! them back in the same order.
//!
//! Invariant: [`Dec`] never panics and never allocates more than the bytes it has left: every
//! length is checked against what remains before anything is read or reserved, and a short or
//! inconsistent body is a [`Short`] error naming the field.

use half::f16;

/// A body too short (or a length too large) for the field named.
#[derive(Debug)]
pub(crate) struct Short(pub String);

/// Appends fields to a byte buffer.
pub(crate) struct Enc<'a>(pub &'a mut Vec<u8>);

impl Enc<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A count or index (`usize`) as 8 bytes.
    pub fn len(&mut self, v: usize) {
        self.u64(v as u64);
    }
    pub fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    pub fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }
    pub fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.0.extend_from_slice(v);
    }
    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    pub fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        v.iter().for_each(|&x| self.u32(x));
    }
    pub fn f32s(&mut self, v: &[f32]) {
        self.len(v.len());
        v.iter().for_each(|&x| self.f32(x));
    }
    pub fn f64s(&mut self, v: &[f64]) {
        self.len(v.len());
        v.iter().for_each(|&x| self.f64(x));
    }
    pub fn u64s(&mut self, v: &[u64]) {
        self.len(v.len());
        v.iter().for_each(|&x| self.u64(x));
    }
    pub fn lens(&mut self, v: &[usize]) {
        self.len(v.len());
        v.iter().for_each(|&x| self.len(x));
    }
    pub fn bools(&mut self, v: &[bool]) {
        self.len(v.len());
        v.iter().for_each(|&x| self.bool(x));
    }
    /// f16 rows, as their bits.
    pub fn f16s(&mut self, v: &[f16]) {
        self.len(v.len());
        self.0.extend_from_slice(bytemuck::cast_slice(v));
    }
}

/// Reads fields back (module doc).
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf, at: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Short> {
        if self.buf.len() - self.at < n {
            return Err(Short(format!("{what}: needs {n} bytes, {} left", self.buf.len() - self.at)));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, Short> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u32(&mut self, what: &str) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self, what: &str) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    pub fn len(&mut self, what: &str) -> Result<usize, Short> {
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| Short(format!("{what}: {v} does not fit this machine")))
    }
    pub fn f32(&mut self, what: &str) -> Result<f32, Short> {
        Ok(f32::from_bits(self.u32(what)?))
    }
    pub fn f64(&mut self, what: &str) -> Result<f64, Short> {
        Ok(f64::from_bits(self.u64(what)?))
    }
    pub fn bool(&mut self, what: &str) -> Result<bool, Short> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Short(format!("{what}: {b} is not a boolean"))),
        }
    }

    /// A count of elements of `size` bytes each, checked against the bytes left.
    fn count(&mut self, size: usize, what: &str) -> Result<usize, Short> {
        let n = self.len(what)?;
        if n.checked_mul(size).is_none_or(|b| b > self.buf.len() - self.at) {
            return Err(Short(format!("{what}: {n} elements of {size} bytes, {} bytes left", self.buf.len() - self.at)));
        }
        Ok(n)
    }

    pub fn bytes(&mut self, what: &str) -> Result<&'a [u8], Short> {
        let n = self.count(1, what)?;
        self.take(n, what)
    }
    pub fn str(&mut self, what: &str) -> Result<String, Short> {
        String::from_utf8(self.bytes(what)?.to_vec()).map_err(|_| Short(format!("{what}: not UTF-8")))
    }
    pub fn u32s(&mut self, what: &str) -> Result<Vec<u32>, Short> {
        let n = self.count(4, what)?;
        (0..n).map(|_| self.u32(what)).collect()
    }
    pub fn f32s(&mut self, what: &str) -> Result<Vec<f32>, Short> {
        let n = self.count(4, what)?;
        (0..n).map(|_| self.f32(what)).collect()
    }
    pub fn f64s(&mut self, what: &str) -> Result<Vec<f64>, Short> {
        let n = self.count(8, what)?;
        (0..n).map(|_| self.f64(what)).collect()
    }
    pub fn u64s(&mut self, what: &str) -> Result<Vec<u64>, Short> {
        let n = self.count(8, what)?;
        (0..n).map(|_| self.u64(what)).collect()
    }
    pub fn lens(&mut self, what: &str) -> Result<Vec<usize>, Short> {
        let n = self.count(8, what)?;
        (0..n).map(|_| self.len(what)).collect()
    }
    pub fn bools(&mut self, what: &str) -> Result<Vec<bool>, Short> {
        let n = self.count(1, what)?;
        (0..n).map(|_| self.bool(what)).collect()
    }
    pub fn f16s(&mut self, what: &str) -> Result<Vec<f16>, Short> {
        let n = self.count(2, what)?;
        let b = self.take(n * 2, what)?;
        Ok(b.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect())
    }

    /// Errors unless every byte was read.
    pub fn finish(&self) -> Result<(), Short> {
        if self.at != self.buf.len() {
            return Err(Short(format!("{} bytes left over after the last field", self.buf.len() - self.at)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_a_short_body_is_an_error() {
        let mut buf = Vec::new();
        let mut e = Enc(&mut buf);
        e.u32(7);
        e.str("owner");
        e.u32s(&[1, 2, 3]);
        e.f16s(&[f16::from_f32(1.5), f16::NEG_INFINITY]);
        e.f64(-0.25);
        let mut d = Dec::new(&buf);
        assert_eq!(d.u32("a").unwrap(), 7);
        assert_eq!(d.str("b").unwrap(), "owner");
        assert_eq!(d.u32s("c").unwrap(), vec![1, 2, 3]);
        assert_eq!(d.f16s("d").unwrap(), vec![f16::from_f32(1.5), f16::NEG_INFINITY]);
        assert_eq!(d.f64("e").unwrap(), -0.25);
        d.finish().unwrap();
        for cut in 0..buf.len() {
            let mut d = Dec::new(&buf[..cut]);
            let r = (|| -> Result<(), Short> {
                d.u32("a")?;
                d.str("b")?;
                d.u32s("c")?;
                d.f16s("d")?;
                d.f64("e")?;
                Ok(())
            })();
            assert!(r.is_err(), "cut at {cut} accepted");
        }
        // A huge count is refused before any allocation.
        let mut buf = Vec::new();
        Enc(&mut buf).len(usize::MAX / 2);
        assert!(Dec::new(&buf).u32s("x").is_err());
    }
}
