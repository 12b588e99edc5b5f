//! Byte-level primitives of the wire format: LEB128 varints for integers (token ids,
//! positions and counters are mostly small), little-endian f32, length-prefixed bytes.
//! Decoding never panics: every read checks what is left.

use super::wire::WireError;

#[derive(Default)]
pub(crate) struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }

    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.bytes.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.bytes.push(v as u8);
    }

    pub fn usize(&mut self, v: usize) {
        self.varint(v as u64);
    }

    pub fn f32(&mut self, v: f32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }

    pub fn bytes(&mut self, v: &[u8]) {
        self.usize(v.len());
        self.bytes.extend_from_slice(v);
    }

    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }

    pub fn tokens(&mut self, v: &[u32]) {
        self.usize(v.len());
        for &t in v {
            self.varint(t as u64);
        }
    }

    pub fn usizes(&mut self, v: &[usize]) {
        self.usize(v.len());
        for &x in v {
            self.usize(x);
        }
    }

    pub fn opt_usize(&mut self, v: Option<usize>) {
        // 0 = none, n + 1 = some(n): one byte for the common case.
        self.varint(v.map_or(0, |n| n as u64 + 1));
    }
}

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    pub fn is_done(&self) -> bool {
        self.at == self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(WireError::Truncated)?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    pub fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            value |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::Malformed("varint longer than 64 bits"))
    }

    pub fn usize(&mut self) -> Result<usize, WireError> {
        usize::try_from(self.varint()?).map_err(|_| WireError::Malformed("integer too large"))
    }

    /// A length that must fit in what is left (each element takes at least one byte),
    /// so a corrupt length cannot make us allocate gigabytes.
    fn len(&mut self) -> Result<usize, WireError> {
        let n = self.usize()?;
        if n > self.bytes.len() - self.at {
            return Err(WireError::Truncated);
        }
        Ok(n)
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        u32::try_from(self.varint()?).map_err(|_| WireError::Malformed("token id above u32"))
    }

    pub fn f32(&mut self) -> Result<f32, WireError> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Malformed("boolean out of range")),
        }
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.len()?;
        self.take(n)
    }

    pub fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| WireError::Malformed("string is not UTF-8"))
    }

    pub fn tokens(&mut self) -> Result<Vec<u32>, WireError> {
        let n = self.len()?;
        (0..n).map(|_| self.u32()).collect()
    }

    pub fn usizes(&mut self) -> Result<Vec<usize>, WireError> {
        let n = self.len()?;
        (0..n).map(|_| self.usize()).collect()
    }

    pub fn opt_usize(&mut self) -> Result<Option<usize>, WireError> {
        Ok(self.usize()?.checked_sub(1))
    }
}
