//! Planning CRI records from the bytes peeked at the head of a container's pipe: a pure
//! function, so every split (lines, 16 KiB partial records, end of stream, a record torn by
//! a crash) is tested without pipes or files.

use super::{LogStream, MAX_LINE};

/// A record whose prefix is in the file but whose content is not complete (only after a
/// crash tore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OpenRecord {
    pub(super) stream: LogStream,
    pub(super) partial: bool,
    /// Content bytes already in the file.
    pub(super) len: usize,
}

/// One step of writing records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Write a record prefix (timestamp, stream, `P` or `F`).
    Start { partial: bool },
    /// Move this many bytes from the pipe into the file.
    Copy(usize),
    /// Write the newline that ends a `P` record (or a line cut short by end of stream).
    End,
}

/// Plans the records for `data`, the bytes at the head of `stream`'s pipe, continuing
/// `open` if it belongs to this stream. `end_of_stream`: `data` is everything the pipe
/// will ever hold. Returns the operations and updates `open`; the operations consume a
/// prefix of `data` (an incomplete last line stays in the pipe).
pub(super) fn plan(
    data: &[u8],
    stream: LogStream,
    open: &mut Option<OpenRecord>,
    end_of_stream: bool,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut rest = data;
    if let Some(record) = open.as_mut().filter(|r| r.stream == stream) {
        let (take, done) = if record.partial {
            let take = (MAX_LINE.saturating_sub(record.len)).min(rest.len());
            (take, record.len + take >= MAX_LINE)
        } else {
            match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (rest.len(), false),
            }
        };
        if take > 0 {
            ops.push(Op::Copy(take));
        }
        record.len += take;
        rest = &rest[take..];
        let newline_copied = !record.partial && done;
        if done || end_of_stream {
            if !newline_copied {
                ops.push(Op::End);
            }
            *open = None;
        } else {
            return ops;
        }
    }
    loop {
        let line_end = rest.iter().position(|&b| b == b'\n');
        let line_len = line_end.unwrap_or(rest.len());
        // Split off 16 KiB partial records while more than that is pending.
        let mut long = line_len;
        while long > MAX_LINE {
            ops.extend([Op::Start { partial: true }, Op::Copy(MAX_LINE), Op::End]);
            long -= MAX_LINE;
            rest = &rest[MAX_LINE..];
        }
        match line_end {
            Some(_) => {
                ops.extend([Op::Start { partial: false }, Op::Copy(long + 1)]);
                rest = &rest[long + 1..];
            }
            None if end_of_stream && long > 0 => {
                ops.extend([Op::Start { partial: false }, Op::Copy(long), Op::End]);
                return ops;
            }
            None => return ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use LogStream::{Stderr, Stdout};
    use Op::{Copy, End, Start};

    const F: Op = Start { partial: false };
    const P: Op = Start { partial: true };

    fn plan_of(data: &[u8], eos: bool) -> Vec<Op> {
        plan(data, Stdout, &mut None, eos)
    }

    #[test]
    fn complete_lines_become_full_records_including_their_newline() {
        assert_eq!(plan_of(b"a\nbb\n", false), vec![F, Copy(2), F, Copy(3)]);
    }

    #[test]
    fn an_incomplete_last_line_stays_in_the_pipe_until_its_newline() {
        assert_eq!(plan_of(b"a\nhel", false), vec![F, Copy(2)]);
        assert_eq!(plan_of(b"hel", false), vec![]);
    }

    #[test]
    fn an_unterminated_last_line_is_written_as_full_at_end_of_stream() {
        assert_eq!(plan_of(b"a\nb", true), vec![F, Copy(2), F, Copy(1), End]);
    }

    #[test]
    fn long_lines_become_partial_records_then_a_full_one() {
        let mut data = vec![b'x'; MAX_LINE * 2 + 10];
        data.push(b'\n');
        assert_eq!(
            plan_of(&data, false),
            vec![P, Copy(MAX_LINE), End, P, Copy(MAX_LINE), End, F, Copy(11)]
        );
        let mut exact = vec![b'x'; MAX_LINE];
        exact.push(b'\n');
        assert_eq!(plan_of(&exact, false), vec![F, Copy(MAX_LINE + 1)]);
    }

    #[test]
    fn a_long_incomplete_line_is_split_off_in_partial_records_and_the_rest_waits() {
        let data = vec![b'x'; MAX_LINE + 5];
        assert_eq!(plan_of(&data, false), vec![P, Copy(MAX_LINE), End]);
    }

    #[test]
    fn a_torn_full_record_is_continued_up_to_its_newline_first() {
        let mut open = Some(OpenRecord {
            stream: Stdout,
            partial: false,
            len: 3,
        });
        let ops = plan(b"xyz\nnext\n", Stdout, &mut open, false);
        assert_eq!(ops, vec![Copy(4), F, Copy(5)]);
        assert_eq!(open, None);
    }

    #[test]
    fn a_torn_partial_record_is_filled_to_sixteen_kib_and_ended() {
        let mut open = Some(OpenRecord {
            stream: Stdout,
            partial: true,
            len: MAX_LINE - 2,
        });
        let ops = plan(b"abcd\n", Stdout, &mut open, false);
        assert_eq!(ops, vec![Copy(2), End, F, Copy(3)]);
        assert_eq!(open, None);
    }

    #[test]
    fn a_torn_record_without_more_data_stays_open_until_end_of_stream() {
        let torn = OpenRecord {
            stream: Stdout,
            partial: false,
            len: 3,
        };
        let mut open = Some(torn);
        assert_eq!(plan(b"more", Stdout, &mut open, false), vec![Copy(4)]);
        assert_eq!(open.map(|r| r.len), Some(7));
        assert_eq!(plan(b"", Stdout, &mut open, true), vec![End]);
        assert_eq!(open, None);
    }

    #[test]
    fn another_streams_torn_record_is_left_alone() {
        let torn = OpenRecord {
            stream: Stderr,
            partial: false,
            len: 3,
        };
        let mut open = Some(torn);
        assert_eq!(plan(b"a\n", Stdout, &mut open, false), vec![F, Copy(2)]);
        assert_eq!(open, Some(torn));
    }
}
