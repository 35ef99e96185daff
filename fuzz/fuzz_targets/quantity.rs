//! Resource quantities (`500m`, `1Gi`, `1e3`): parse, then every conversion the agent uses.
#![no_main]

use ironlet::qos::Quantity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(q) = Quantity::parse(text) {
        let _ = (q.is_negative(), q.is_zero());
        let _ = (q.milli_value(), q.value(), q.milli_amount(), q.amount());
        let shown = q.to_string();
        let _ = Quantity::parse(&shown);
    }
});
