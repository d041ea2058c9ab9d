"""The exceptions pyllamaspec raises. Every message says what was wrong and what to do about it."""


class PyllamaspecError(Exception):
    """Base class of every error this package raises on purpose."""


class BuildError(PyllamaspecError):
    """The native library is missing, incomplete or does not match the Python binding."""


class BackendUnavailableError(BuildError):
    """A GPU backend's runtime (CUDA, ROCm) is missing or of the wrong version."""


class ModelLoadError(PyllamaspecError):
    """A GGUF file is missing, truncated, corrupt or of an architecture this build cannot load."""


class ConfigError(PyllamaspecError, ValueError):
    """A configuration value is out of range or contradicts another one."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value is of the wrong type (a string where a number belongs, a float for an integer)."""


class ParamError(ConfigError):
    """One named parameter is of the wrong value; `param` names it (as the API spells it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ChatTemplateError(ConfigError):
    """A model has no chat template, or the template cannot be parsed or rendered for these messages."""


class PairingError(PyllamaspecError):
    """A drafter cannot work with this target (hidden size, vocab, layer ids, mask token, arch)."""


class PlacementError(PyllamaspecError):
    """The requested device placement cannot work (e.g. a drafter away from the target's LM head)."""


class MemoryBudgetError(PyllamaspecError):
    """The estimated memory need exceeds what the devices have free."""


class ContextOverflowError(PyllamaspecError):
    """The prompt (plus what must be generated) does not fit the context."""


class GenerationError(PyllamaspecError):
    """The native loop failed while decoding, or the session cannot generate now (closed)."""


class RemoteDeviceError(GenerationError):
    """A remote device (an rpc-server) cannot be reached or does not answer, or went away while in use: the
    message names the host. A session that used it is unusable from then on; the process and the sessions on other
    devices go on."""


class ForkedProcessError(GenerationError):
    """A model or session opened before os.fork() is used in the child process, where its native state
    (threads, device contexts) does not exist."""


class SessionBusyError(GenerationError):
    """The session is generating (on another thread, or this call comes from inside its own callback)."""


class ConversionError(PyllamaspecError):
    """A checkpoint cannot be converted (unsupported layout, missing or mis-shaped tensors)."""


class QuantizeError(PyllamaspecError):
    """Requantization failed or was refused."""


class DownloadError(PyllamaspecError):
    """A download failed, was not found, or did not match its checksum."""
