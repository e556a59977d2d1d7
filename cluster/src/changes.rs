//! A view's changes, as `SUBSCRIBE` reads them: from each TaskManager
//! that holds a part of the view's changelog (or from each part of a
//! checkpoint in storage), a page at a time, merged into one order —
//! epoch by epoch, each epoch's deletes before its inserts. A reader holds
//! a page per part, whatever the size of an epoch or of the history.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use executor::operators::changelog::ChangeReader;
use storage::KvStore;
use tokio::sync::mpsc;

use crate::Result;
use crate::gateway::ViewStream;

/// Changes a page holds: a few MiB of them at a time.
pub(crate) const PAGE: usize = 16_384;

/// Reads `reader`'s pages of `state` on a blocking thread as the stream
/// is polled; `keep` (what `state` lives in) goes after `state`.
pub(crate) fn pages<K: Send + 'static>(
    state: Arc<KvStore>,
    mut reader: ChangeReader,
    keep: K,
) -> ViewStream {
    let (tx, rx) = mpsc::channel::<Result<RecordBatch>>(2);
    tokio::task::spawn_blocking(move || {
        loop {
            let page = match reader.next_page(&*state, PAGE) {
                Ok(Some(page)) => Ok(page),
                Ok(None) => break,
                Err(e) => Err(e.into()),
            };
            let failed = page.is_err();
            if tx.blocking_send(page).is_err() || failed {
                break;
            }
        }
        drop(state);
        drop(keep);
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Merges change streams, each in [`ChangeReader`]'s order (no page holds
/// two epochs or two kinds of change), into one such order. Holds one
/// page per stream.
pub(crate) fn merge_by_epoch(mut streams: Vec<ViewStream>) -> ViewStream {
    use futures::StreamExt;
    if streams.len() == 1
        && let Some(only) = streams.pop()
    {
        return only;
    }
    let heads: Vec<(ViewStream, Option<RecordBatch>)> =
        streams.into_iter().map(|s| (s, None)).collect();
    futures::stream::try_unfold(heads, |mut heads| async move {
        let mut i = 0;
        while i < heads.len() {
            if heads[i].1.is_none() {
                match heads[i].0.next().await {
                    Some(page) => heads[i].1 = Some(page?),
                    None => {
                        drop(heads.swap_remove(i));
                        continue;
                    }
                }
            }
            i += 1;
        }
        let first = (0..heads.len()).min_by_key(|&i| heads[i].1.as_ref().map(page_order));
        Ok(first
            .and_then(|i| heads[i].1.take())
            .map(|page| (page, heads)))
    })
    .boxed()
}

/// (epoch, inserts) of a page of changes.
fn page_order(page: &RecordBatch) -> (i64, bool) {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    let first = |c: usize| {
        page.column(c)
            .as_primitive_opt::<Int64Type>()
            .filter(|a| !a.is_empty())
            .map_or(i64::MIN, |a| a.value(0))
    };
    (first(0), first(1) > 0)
}
