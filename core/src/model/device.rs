//! Where a model runs: this process's CPU cores, or a CUDA card by ordinal (`cuda:N`).

use std::fmt;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl DeviceSpec {
    pub fn is_cuda(self) -> bool {
        matches!(self, DeviceSpec::Cuda(_))
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let refuse = || format!("device {s:?} is not known: use cpu, cuda or cuda:N (N = 0, 1, ...)");
        match s.trim() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            other => match other.strip_prefix("cuda:") {
                Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    n.parse().map(DeviceSpec::Cuda).map_err(|_| refuse())
                }
                _ => Err(refuse()),
            },
        }
    }
}

impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_back() {
        for (text, device) in
            [("cpu", DeviceSpec::Cpu), ("cuda:0", DeviceSpec::Cuda(0)), ("cuda:3", DeviceSpec::Cuda(3))]
        {
            assert_eq!(text.parse::<DeviceSpec>().unwrap(), device);
            assert_eq!(device.to_string(), text);
        }
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        for bad in ["cuda:", "cuda:-1", "cuda:x", "tpu", "cuda:1:2", ""] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains("cuda:N"), "{bad}: {e}");
        }
        let yaml: DeviceSpec = serde_json::from_str("\"cuda:1\"").unwrap();
        assert_eq!(yaml, DeviceSpec::Cuda(1));
        assert!(serde_json::from_str::<DeviceSpec>("\"metal\"").is_err());
    }
}
