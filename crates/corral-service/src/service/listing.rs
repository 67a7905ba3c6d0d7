//! Listings of sessions in creation order, a page at a time (docs/api.md, "List"): one key's
//! (`GET /v1/sandboxes`), or every key's together (an operator's `GET
//! /v1/operator/sandboxes`), with the same cursor.

use std::collections::HashMap;
use std::time::SystemTime;

use super::{ListPage, ListQuery, Owned, SandboxInfo, Service, ServiceError, Tenant, LIST_LIMIT};

/// One page of every key's sessions: each with its key, in creation order, and the cursor of
/// the next page when there are more.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedPage {
    pub sandboxes: Vec<(Tenant, SandboxInfo)>,
    pub next: Option<String>,
}

/// A session's place in the order of a listing, and its cursor: its creation time and id, so
/// that sessions that end meanwhile do not move the next page.
fn cursor(created_at: SystemTime, id: &str) -> String {
    let nanos = created_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:020}-{id}")
}

impl Service {
    /// `tenant`'s sessions that `query` asks for, in creation order, a page at a time. A
    /// look-up that never waits for a sandbox: it takes no admission.
    pub fn list(&self, tenant: &Tenant, query: &ListQuery) -> Result<ListPage, ServiceError> {
        let page = self.list_owned(Some(tenant), query)?;
        Ok(ListPage {
            sandboxes: page.sandboxes.into_iter().map(|(_, info)| info).collect(),
            next: page.next,
        })
    }

    /// The sessions of every key (of `tenant` only, if given) that `query` asks for, each with
    /// its key, in creation order across keys, a page at a time.
    pub fn list_owned(
        &self,
        tenant: Option<&Tenant>,
        query: &ListQuery,
    ) -> Result<OwnedPage, ServiceError> {
        let limit = query.limit.unwrap_or(LIST_LIMIT);
        if limit == 0 || limit > LIST_LIMIT {
            return Err(ServiceError::BadRequest(format!(
                "`limit` must be between 1 and {LIST_LIMIT}"
            )));
        }
        if let Some(bad) = query
            .states
            .iter()
            .find(|s| !matches!(s.as_str(), "running" | "paused" | "dead"))
        {
            return Err(ServiceError::BadRequest(format!(
                "`state` {bad:?}: the states are running, paused and dead"
            )));
        }
        let owned: HashMap<String, Owned> = self
            .sessions
            .lock()
            .iter()
            .filter(|(_, o)| tenant.is_none_or(|t| o.tenant == *t))
            .filter(|(_, o)| query.image.as_ref().is_none_or(|i| *i == o.image))
            .filter(|(_, o)| {
                query
                    .metadata
                    .iter()
                    .all(|(k, v)| o.metadata.get(k) == Some(v))
            })
            .map(|(id, o)| (id.clone(), o.clone()))
            .collect();
        let mut sessions: Vec<(String, Tenant, SandboxInfo)> = self
            .manager
            .list()
            .into_iter()
            .filter_map(|info| {
                let o = owned.get(&info.id)?;
                Some((
                    cursor(info.created_at, &info.id),
                    o.tenant.clone(),
                    Self::info(&info, o),
                ))
            })
            .collect();
        // Sandboxes saved across a restart, paused.
        sessions.extend(
            self.saved
                .of(&self.db, tenant)
                .iter()
                .map(|saved| {
                    (
                        cursor(saved.created_at(), &saved.id),
                        saved.tenant.clone(),
                        self.saved_info(saved),
                    )
                })
                .filter(|(_, _, info)| query.image.as_ref().is_none_or(|i| *i == info.image))
                .filter(|(_, _, info)| {
                    query
                        .metadata
                        .iter()
                        .all(|(k, v)| info.metadata.get(k) == Some(v))
                }),
        );
        sessions.sort_by(|a, b| a.0.cmp(&b.0));
        let mut matching: Vec<(String, Tenant, SandboxInfo)> = sessions
            .into_iter()
            .filter(|(at, _, _)| query.after.as_ref().is_none_or(|after| at > after))
            .filter(|(_, _, info)| query.states.is_empty() || query.states.contains(&info.state))
            .take(limit + 1)
            .collect();
        let next = (matching.len() > limit).then(|| {
            matching.truncate(limit);
            matching
                .last()
                .map(|(at, _, _)| at.clone())
                .unwrap_or_default()
        });
        Ok(OwnedPage {
            sandboxes: matching
                .into_iter()
                .map(|(_, tenant, info)| (tenant, info))
                .collect(),
            next,
        })
    }
}
