//! Code contexts: more interpreters in a session's sandbox, of any language its image has
//! ([`corral_kernel::context`]), by the session's owner only.

use corral_kernel::{ContextInfo, Language};

use super::{Admitted, Service, ServiceError};

impl Service {
    /// The language `name` if session `id`'s image has it.
    pub(super) fn context_language(&self, id: &str, name: &str) -> Result<Language, ServiceError> {
        let language = Language::parse(name).ok_or_else(|| {
            ServiceError::UnsupportedLanguage(format!(
                "unknown language `{name}` (python, javascript or bash)"
            ))
        })?;
        let image = self.sessions.lock().get(id).map(|o| o.image.clone());
        let image = self.image(image.as_deref())?;
        Self::check_language(&image, language)?;
        Ok(language)
    }

    /// Starts a code context of `language` in `tenant`'s session `id`, in `cwd` (an absolute
    /// path inside the sandbox; none: `/workspace`).
    pub fn create_context(
        &self,
        call: &Admitted,
        id: &str,
        language: &str,
        cwd: Option<String>,
    ) -> Result<ContextInfo, ServiceError> {
        self.check_running()?;
        self.check_session(call.tenant(), id)?;
        if let Some(cwd) = &cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') {
                return Err(ServiceError::BadRequest(
                    "cwd must be an absolute path inside the sandbox".into(),
                ));
            }
        }
        let language = self.context_language(id, language)?;
        self.manager
            .create_context(id, language, cwd)
            .map_err(|e| self.manager_error(id, e))
    }

    pub fn list_contexts(
        &self,
        call: &Admitted,
        id: &str,
    ) -> Result<Vec<ContextInfo>, ServiceError> {
        let tenant = call.tenant();
        self.owned(tenant, id)?;
        self.manager
            .list_contexts(id)
            .map_err(|e| self.manager_error(id, e))
    }

    pub fn restart_context(
        &self,
        call: &Admitted,
        id: &str,
        context: &str,
    ) -> Result<(), ServiceError> {
        self.check_running()?;
        self.check_session(call.tenant(), id)?;
        self.manager
            .restart_context(id, context)
            .map_err(|e| self.manager_error(id, e))
    }

    pub fn remove_context(
        &self,
        call: &Admitted,
        id: &str,
        context: &str,
    ) -> Result<(), ServiceError> {
        let tenant = call.tenant();
        self.owned(tenant, id)?;
        self.manager
            .remove_context(id, context)
            .map_err(|e| self.manager_error(id, e))
    }

    /// The context an execution runs in: `context` if given, else the default context of
    /// `language` when that is not the session's own (started now if need be); `None`: the
    /// session's own kernel.
    pub(super) fn execution_context(
        &self,
        id: &str,
        context: Option<&str>,
        language: Option<&str>,
    ) -> Result<Option<String>, ServiceError> {
        if let Some(context) = context {
            return Ok(Some(context.to_string()));
        }
        let Some(name) = language else {
            return Ok(None);
        };
        let language = self.context_language(id, name)?;
        let main = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?
            .language;
        if language.name() == main {
            return Ok(None);
        }
        self.manager
            .default_context(id, language)
            .map(Some)
            .map_err(|e| self.manager_error(id, e))
    }
}
