//! The messages of PostgreSQL's `pgoutput` logical decoding plugin
//! (protocol version 1, text values), as the `postgres-cdc` connector
//! receives them in a replication stream's `XLogData`.
//!
//! `pgwire-replication` runs the replication protocol and hands over the
//! transaction boundaries (`Begin`, `Commit`) itself; the other messages
//! arrive as bytes, decoded here. Layouts: PostgreSQL's documentation,
//! "Logical Replication Message Formats".

/// One column of a row as `pgoutput` sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Null,
    /// A TOASTed value that the change did not touch: not sent.
    Unchanged,
    /// The value in PostgreSQL's text form.
    Text(String),
}

/// A table's description, sent before its first change in a session and
/// whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    /// Column names, in the order of the rows' cells.
    pub columns: Vec<String>,
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Relation(Relation),
    Insert {
        relation: u32,
        new: Vec<Cell>,
    },
    /// `old` is the old key (`K`) or the whole old row (`O`, with
    /// `REPLICA IDENTITY FULL`), when sent.
    Update {
        relation: u32,
        old: Option<Vec<Cell>>,
        new: Vec<Cell>,
    },
    /// The old key, or the whole old row.
    Delete {
        relation: u32,
        old: Vec<Cell>,
    },
    Truncate {
        relations: Vec<u32>,
    },
    /// Begin, Commit, Origin, Type, Message: nothing for the connector.
    Other(u8),
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("message ends early".into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }

    fn string(&mut self) -> Result<String, String> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or("unterminated string")?;
        let s = String::from_utf8(self.bytes[..end].to_vec()).map_err(|e| e.to_string())?;
        self.bytes = &self.bytes[end + 1..];
        Ok(s)
    }

    fn tuple(&mut self) -> Result<Vec<Cell>, String> {
        let n = self.u16()?;
        (0..n)
            .map(|_| match self.u8()? {
                b'n' => Ok(Cell::Null),
                b'u' => Ok(Cell::Unchanged),
                b't' => {
                    let len = self.u32()? as usize;
                    let bytes = self.take(len)?;
                    String::from_utf8(bytes.to_vec())
                        .map(Cell::Text)
                        .map_err(|e| e.to_string())
                }
                other => Err(format!("unknown tuple cell kind {:?}", other as char)),
            })
            .collect()
    }
}

/// Decodes one `pgoutput` message.
pub(crate) fn decode(bytes: &[u8]) -> Result<Message, String> {
    let mut r = Reader { bytes };
    let tag = r.u8()?;
    Ok(match tag {
        b'R' => {
            let id = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let _replica_identity = r.u8()?;
            let n = r.u16()?;
            let mut columns = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let _flags = r.u8()?;
                columns.push(r.string()?);
                let _type_oid = r.u32()?;
                let _type_modifier = r.u32()?;
            }
            Message::Relation(Relation {
                id,
                namespace,
                name,
                columns,
            })
        }
        b'I' => {
            let relation = r.u32()?;
            expect(&mut r, b'N')?;
            Message::Insert {
                relation,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let relation = r.u32()?;
            let (old, new) = match r.u8()? {
                b'K' | b'O' => {
                    let old = r.tuple()?;
                    expect(&mut r, b'N')?;
                    (Some(old), r.tuple()?)
                }
                b'N' => (None, r.tuple()?),
                other => return Err(format!("unknown Update part {:?}", other as char)),
            };
            Message::Update { relation, old, new }
        }
        b'D' => {
            let relation = r.u32()?;
            match r.u8()? {
                b'K' | b'O' => {}
                other => return Err(format!("unknown Delete part {:?}", other as char)),
            }
            Message::Delete {
                relation,
                old: r.tuple()?,
            }
        }
        b'T' => {
            let n = r.u32()?;
            let _options = r.u8()?;
            Message::Truncate {
                relations: (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?,
            }
        }
        other => Message::Other(other),
    })
}

fn expect(r: &mut Reader<'_>, want: u8) -> Result<(), String> {
    match r.u8()? {
        b if b == want => Ok(()),
        other => Err(format!(
            "expected {:?}, found {:?}",
            want as char, other as char
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(cells: &[Option<&str>]) -> Vec<u8> {
        let mut out = (cells.len() as u16).to_be_bytes().to_vec();
        for c in cells {
            match c {
                None => out.push(b'n'),
                Some(v) => {
                    out.push(b't');
                    out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    out.extend_from_slice(v.as_bytes());
                }
            }
        }
        out
    }

    #[test]
    fn relations_and_changes_decode() {
        let mut rel = vec![b'R'];
        rel.extend_from_slice(&7u32.to_be_bytes());
        rel.extend_from_slice(b"public\0people\0d");
        rel.extend_from_slice(&2u16.to_be_bytes());
        for (flags, name) in [(1u8, "id"), (0, "name")] {
            rel.push(flags);
            rel.extend_from_slice(name.as_bytes());
            rel.push(0);
            rel.extend_from_slice(&23u32.to_be_bytes());
            rel.extend_from_slice(&u32::MAX.to_be_bytes());
        }
        assert_eq!(
            decode(&rel).unwrap(),
            Message::Relation(Relation {
                id: 7,
                namespace: "public".into(),
                name: "people".into(),
                columns: vec!["id".into(), "name".into()],
            })
        );
        let mut ins = vec![b'I'];
        ins.extend_from_slice(&7u32.to_be_bytes());
        ins.push(b'N');
        ins.extend(tuple(&[Some("1"), None]));
        assert_eq!(
            decode(&ins).unwrap(),
            Message::Insert {
                relation: 7,
                new: vec![Cell::Text("1".into()), Cell::Null]
            }
        );
        let mut upd = vec![b'U'];
        upd.extend_from_slice(&7u32.to_be_bytes());
        upd.push(b'K');
        upd.extend(tuple(&[Some("1"), None]));
        upd.push(b'N');
        upd.extend(tuple(&[Some("2"), Some("b")]));
        let Message::Update {
            old: Some(old),
            new,
            ..
        } = decode(&upd).unwrap()
        else {
            panic!("not an update");
        };
        assert_eq!((old.len(), new[1].clone()), (2, Cell::Text("b".into())));
        let mut del = vec![b'D'];
        del.extend_from_slice(&7u32.to_be_bytes());
        del.push(b'K');
        del.extend(tuple(&[Some("2"), None]));
        assert!(matches!(
            decode(&del).unwrap(),
            Message::Delete { relation: 7, .. }
        ));
        assert!(decode(&del[..del.len() - 1]).is_err());
        assert_eq!(decode(b"B").unwrap(), Message::Other(b'B'));
    }
}
