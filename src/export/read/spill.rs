//! The spill format: one call as length-prefixed little-endian bytes
//! ([`encode`], [`decode`]), and one teacher score ([`encode_score`],
//! [`decode_score`]), for the partition files.

use super::{CallRec, ScoreRec};

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt_str(out: &mut Vec<u8>, s: &Option<String>) {
    match s {
        Some(s) => {
            out.push(1);
            put_bytes(out, s.as_bytes());
        }
        None => out.push(0),
    }
}

fn put_opt_i64(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
        None => out.push(0),
    }
}

pub(super) fn encode(c: &CallRec, out: &mut Vec<u8>) {
    put_bytes(out, c.rollout_id.as_bytes());
    out.extend_from_slice(&c.sequence.to_le_bytes());
    put_bytes(out, c.wire_api.as_bytes());
    put_opt_str(out, &c.model);
    put_opt_str(out, &c.route);
    put_bytes(out, c.status.as_bytes());
    put_opt_str(out, &c.failure_class);
    put_opt_str(out, &c.messages);
    put_opt_str(out, &c.tools);
    put_opt_str(out, &c.response_message);
    for ids in [&c.prompt_ids, &c.completion_ids] {
        match ids {
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                for x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            None => out.push(0),
        }
    }
    put_opt_f64s(out, &c.completion_logprobs);
    put_opt_str(out, &c.user_agent);
    out.extend_from_slice(&c.received_at.to_le_bytes());
    put_opt_i64(out, c.prompt_tokens);
    put_opt_i64(out, c.completion_tokens);
    put_opt_i64(out, c.history_len);
    put_opt_i64(out, c.policy_version);
    put_opt_i64(out, c.attempt_of);
    out.push(u8::from(c.side_call));
    put_opt_str(out, &c.continued);
    put_opt_f64s(out, &c.teacher_logprobs);
}

fn put_opt_f64s(out: &mut Vec<u8>, v: &Option<Vec<f64>>) {
    match v {
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        None => out.push(0),
    }
}

pub(super) fn encode_score(s: &ScoreRec, out: &mut Vec<u8>) {
    put_bytes(out, s.rollout_id.as_bytes());
    out.extend_from_slice(&s.sequence.to_le_bytes());
    out.extend_from_slice(&s.scored_at.to_le_bytes());
    put_bytes(out, s.teacher.as_bytes());
    put_opt_f64s(out, &Some(s.logprobs.clone()));
}

pub(super) fn decode_score(b: &[u8]) -> Option<ScoreRec> {
    let mut c = Cursor(b);
    Some(ScoreRec {
        rollout_id: c.string()?,
        sequence: c.i64()?,
        scored_at: c.i64()?,
        teacher: c.string()?,
        logprobs: c.opt_f64s()??,
    })
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn opt_string(&mut self) -> Option<Option<String>> {
        match self.u8()? {
            0 => Some(None),
            _ => Some(Some(self.string()?)),
        }
    }
    fn opt_i64(&mut self) -> Option<Option<i64>> {
        match self.u8()? {
            0 => Some(None),
            _ => Some(Some(self.i64()?)),
        }
    }
    fn opt_ids(&mut self) -> Option<Option<Vec<i32>>> {
        if self.u8()? == 0 {
            return Some(None);
        }
        let n = self.u32()? as usize;
        let b = self.take(n * 4)?;
        Some(Some(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
    fn opt_f64s(&mut self) -> Option<Option<Vec<f64>>> {
        if self.u8()? == 0 {
            return Some(None);
        }
        let n = self.u32()? as usize;
        let b = self.take(n * 8)?;
        Some(Some(
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ))
    }
}

pub(super) fn decode(b: &[u8]) -> Option<CallRec> {
    let mut c = Cursor(b);
    Some(CallRec {
        rollout_id: c.string()?,
        sequence: c.i64()?,
        wire_api: c.string()?,
        model: c.opt_string()?,
        route: c.opt_string()?,
        status: c.string()?,
        failure_class: c.opt_string()?,
        messages: c.opt_string()?,
        tools: c.opt_string()?,
        response_message: c.opt_string()?,
        prompt_ids: c.opt_ids()?,
        completion_ids: c.opt_ids()?,
        completion_logprobs: c.opt_f64s()?,
        user_agent: c.opt_string()?,
        received_at: c.i64()?,
        prompt_tokens: c.opt_i64()?,
        completion_tokens: c.opt_i64()?,
        history_len: c.opt_i64()?,
        policy_version: c.opt_i64()?,
        attempt_of: c.opt_i64()?,
        side_call: c.u8()? == 1,
        continued: c.opt_string()?,
        teacher_logprobs: c.opt_f64s()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spill_records_round_trip() {
        let c = CallRec {
            rollout_id: "r".into(),
            sequence: 7,
            wire_api: "chat_completions".into(),
            model: Some("m".into()),
            status: "ok".into(),
            messages: Some("[]".into()),
            prompt_ids: Some(vec![1, -2, 3]),
            completion_logprobs: Some(vec![-0.5, f64::NAN]),
            received_at: 42,
            completion_tokens: Some(3),
            ..Default::default()
        };
        let mut b = Vec::new();
        encode(&c, &mut b);
        let d = decode(&b).expect("decodes");
        assert_eq!(d.prompt_ids, c.prompt_ids);
        assert!(d
            .completion_logprobs
            .as_ref()
            .is_some_and(|v| v[1].is_nan()));
        assert_eq!(d.completion_tokens, Some(3));
        assert_eq!(d.route, None);
        assert!(decode(&b[..b.len() - 1]).is_none());
    }
}
