//! A minimal protobuf encoder: just the wire types pprof's `profile.proto`
//! needs (varint, length-delimited, packed repeated varints).

/// An encoded message under construction.
#[derive(Debug, Default, Clone)]
pub(crate) struct Message {
    pub buf: Vec<u8>,
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

impl Message {
    fn key(&mut self, field: u32, wire: u8) {
        varint(&mut self.buf, (u64::from(field) << 3) | u64::from(wire));
    }

    /// A varint field (int64/uint64/bool); zero values are omitted, as
    /// proto3 does.
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        if v != 0 {
            self.key(field, 0);
            varint(&mut self.buf, v);
        }
        self
    }

    /// An int64 field.
    pub fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint(field, v as u64)
    }

    /// A bytes / string / embedded message field (always written).
    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Self {
        self.key(field, 2);
        varint(&mut self.buf, v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// An embedded message.
    pub fn message(&mut self, field: u32, m: &Message) -> &mut Self {
        self.bytes(field, &m.buf)
    }

    /// A packed repeated varint field (omitted when empty).
    pub fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) -> &mut Self {
        self.packed_with(field, values, &mut Vec::new())
    }

    /// [`packed`](Self::packed), encoding the values in `scratch` first
    /// (a buffer kept between calls).
    pub fn packed_with(
        &mut self,
        field: u32,
        values: impl IntoIterator<Item = u64>,
        scratch: &mut Vec<u8>,
    ) -> &mut Self {
        scratch.clear();
        for v in values {
            varint(scratch, v);
        }
        if !scratch.is_empty() {
            self.bytes(field, scratch);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        let mut m = Message::default();
        m.uint(1, 150)
            .bytes(2, b"ab")
            .packed(3, [1, 300])
            .uint(4, 0)
            .int(5, -1);
        #[rustfmt::skip]
        let expected = [
            0x08, 0x96, 0x01,             // field 1 varint 150
            0x12, 0x02, b'a', b'b',       // field 2 bytes "ab"
            0x1a, 0x03, 0x01, 0xac, 0x02, // field 3 packed [1, 300]
            // field 4 = 0 omitted
            0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, // field 5 = -1
        ];
        assert_eq!(m.buf, expected);
    }
}
