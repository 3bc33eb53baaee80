//! Per-format details. The stateless CSV-like formats are documented on
//! the [`Format`](crate::Format) variants; the modules below document the
//! formats that need more (RWBS decoding, the file-to-block mapping, binary
//! layouts).

pub mod blkparse;
pub mod compact;
pub(crate) mod csv;
pub mod mobigen;
pub mod vscsi;

use crate::record::Op;

/// Maps a SCSI opcode (as recorded by vSCSI and CloudPhysics traces) to an
/// operation, or `None` for commands that move no user data and are skipped
/// (INQUIRY, TEST UNIT READY, ...).
///
/// * READ(6/10/12/16) `0x08 0x28 0xa8 0x88` → [`Op::Read`]
/// * WRITE(6/10/12/16) `0x0a 0x2a 0xaa 0x8a` → [`Op::Write`]
/// * SYNCHRONIZE CACHE(10/16) `0x35 0x91` → [`Op::Flush`]
///
/// UNMAP (`0x42`) carries its ranges in a parameter list that the traces do
/// not record, so it is skipped rather than guessed.
pub(crate) fn scsi_op(opcode: u16) -> Option<Op> {
    match opcode {
        0x08 | 0x28 | 0xa8 | 0x88 => Some(Op::Read),
        0x0a | 0x2a | 0xaa | 0x8a => Some(Op::Write),
        0x35 | 0x91 => Some(Op::Flush),
        _ => None,
    }
}
