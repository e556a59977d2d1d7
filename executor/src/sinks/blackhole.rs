//! `connector = 'blackhole'`: takes every row and keeps none. For
//! measuring a query's speed without the cost of a target (Flink's and
//! RisingWave's connector of the same name).

use async_trait::async_trait;
use planner::spec::ConnectorSpec;
use storage::chunk::Chunk;

use super::{SinkConnector, SinkContext, SinkWriter};
use crate::connectors::Options;
use crate::{ExecError, Result};

pub(super) struct Blackhole;

impl Blackhole {
    pub(super) fn new(spec: &ConnectorSpec) -> Result<Self> {
        Options::new("blackhole", &spec.options).finish(&["(none)"])?;
        if spec.format.is_some() {
            return Err(ExecError::InvalidOption(
                "sink connector blackhole takes no FORMAT".into(),
            ));
        }
        Ok(Self)
    }
}

#[async_trait]
impl SinkConnector for Blackhole {
    async fn check(&self) -> Result<()> {
        Ok(())
    }

    fn writer(&self, _ctx: &SinkContext) -> Result<Box<dyn SinkWriter>> {
        Ok(Box::new(Blackhole))
    }
}

#[async_trait]
impl SinkWriter for Blackhole {
    async fn write(&mut self, _chunk: &Chunk) -> Result<()> {
        Ok(())
    }

    async fn prepare(&mut self, _checkpoint: u64) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    async fn commit(&mut self, _checkpoint: u64, _committable: &[u8]) -> Result<()> {
        Ok(())
    }
}
