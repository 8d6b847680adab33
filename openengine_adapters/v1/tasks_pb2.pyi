from openengine_adapters.v1 import input_pb2 as _input_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskInputType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_INPUT_TYPE_UNSPECIFIED: _ClassVar[TaskInputType]
    TASK_INPUT_TYPE_TEXT: _ClassVar[TaskInputType]
    TASK_INPUT_TYPE_TOKEN_IDS: _ClassVar[TaskInputType]
    TASK_INPUT_TYPE_MULTIMODAL: _ClassVar[TaskInputType]

class TaskOutputGranularity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_OUTPUT_GRANULARITY_UNSPECIFIED: _ClassVar[TaskOutputGranularity]
    TASK_OUTPUT_GRANULARITY_SEQUENCE: _ClassVar[TaskOutputGranularity]
    TASK_OUTPUT_GRANULARITY_TOKEN: _ClassVar[TaskOutputGranularity]

class EmbeddingEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EMBEDDING_ENCODING_UNSPECIFIED: _ClassVar[EmbeddingEncoding]
    EMBEDDING_ENCODING_DENSE: _ClassVar[EmbeddingEncoding]
    EMBEDDING_ENCODING_SPARSE: _ClassVar[EmbeddingEncoding]

class TaskValueSemantics(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_VALUE_SEMANTICS_UNSPECIFIED: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_LOGITS: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_PROBABILITIES: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_LOG_PROBABILITIES: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_SIMILARITY: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_RELEVANCE: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_REWARD: _ClassVar[TaskValueSemantics]
    TASK_VALUE_SEMANTICS_MODEL_DEFINED: _ClassVar[TaskValueSemantics]

class ScoreNormalization(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORE_NORMALIZATION_UNSPECIFIED: _ClassVar[ScoreNormalization]
    SCORE_NORMALIZATION_NONE: _ClassVar[ScoreNormalization]
    SCORE_NORMALIZATION_SOFTMAX: _ClassVar[ScoreNormalization]
TASK_INPUT_TYPE_UNSPECIFIED: TaskInputType
TASK_INPUT_TYPE_TEXT: TaskInputType
TASK_INPUT_TYPE_TOKEN_IDS: TaskInputType
TASK_INPUT_TYPE_MULTIMODAL: TaskInputType
TASK_OUTPUT_GRANULARITY_UNSPECIFIED: TaskOutputGranularity
TASK_OUTPUT_GRANULARITY_SEQUENCE: TaskOutputGranularity
TASK_OUTPUT_GRANULARITY_TOKEN: TaskOutputGranularity
EMBEDDING_ENCODING_UNSPECIFIED: EmbeddingEncoding
EMBEDDING_ENCODING_DENSE: EmbeddingEncoding
EMBEDDING_ENCODING_SPARSE: EmbeddingEncoding
TASK_VALUE_SEMANTICS_UNSPECIFIED: TaskValueSemantics
TASK_VALUE_SEMANTICS_LOGITS: TaskValueSemantics
TASK_VALUE_SEMANTICS_PROBABILITIES: TaskValueSemantics
TASK_VALUE_SEMANTICS_LOG_PROBABILITIES: TaskValueSemantics
TASK_VALUE_SEMANTICS_SIMILARITY: TaskValueSemantics
TASK_VALUE_SEMANTICS_RELEVANCE: TaskValueSemantics
TASK_VALUE_SEMANTICS_REWARD: TaskValueSemantics
TASK_VALUE_SEMANTICS_MODEL_DEFINED: TaskValueSemantics
SCORE_NORMALIZATION_UNSPECIFIED: ScoreNormalization
SCORE_NORMALIZATION_NONE: ScoreNormalization
SCORE_NORMALIZATION_SOFTMAX: ScoreNormalization

class TaskRequestContext(_message.Message):
    __slots__ = ("request_id", "model", "lora_name", "priority", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    lora_name: str
    priority: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., lora_name: _Optional[str] = ..., priority: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TaskInput(_message.Message):
    __slots__ = ("item_id", "text", "token_ids", "multimodal")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    text: str
    token_ids: _input_pb2.TokenIds
    multimodal: MultimodalTaskInput
    def __init__(self, item_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[_input_pb2.TokenIds, _Mapping]] = ..., multimodal: _Optional[_Union[MultimodalTaskInput, _Mapping]] = ...) -> None: ...

class MultimodalTaskInput(_message.Message):
    __slots__ = ("text", "token_ids", "media")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _input_pb2.TokenIds
    media: _containers.RepeatedCompositeFieldContainer[_input_pb2.MediaItem]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[_input_pb2.TokenIds, _Mapping]] = ..., media: _Optional[_Iterable[_Union[_input_pb2.MediaItem, _Mapping]]] = ...) -> None: ...

class DenseFloatTensor(_message.Message):
    __slots__ = ("shape", "values")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class SparseFloatTensor(_message.Message):
    __slots__ = ("shape", "indices", "values")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class TaskUsage(_message.Message):
    __slots__ = ("input_tokens", "cached_input_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    cached_input_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ...) -> None: ...

class TaskCapabilities(_message.Message):
    __slots__ = ("embed", "classify", "score")
    EMBED_FIELD_NUMBER: _ClassVar[int]
    CLASSIFY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    embed: EmbedCapabilities
    classify: ClassifyCapabilities
    score: ScoreCapabilities
    def __init__(self, embed: _Optional[_Union[EmbedCapabilities, _Mapping]] = ..., classify: _Optional[_Union[ClassifyCapabilities, _Mapping]] = ..., score: _Optional[_Union[ScoreCapabilities, _Mapping]] = ...) -> None: ...

class EmbedCapabilities(_message.Message):
    __slots__ = ("supported", "input_types", "granularities", "encodings", "dimension", "max_batch_size", "max_output_values_per_item", "supports_priority", "supports_lora", "supports_normalization", "supports_dimension_override", "modalities")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    GRANULARITIES_FIELD_NUMBER: _ClassVar[int]
    ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_VALUES_PER_ITEM_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_LORA_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_DIMENSION_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    MODALITIES_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    input_types: _containers.RepeatedScalarFieldContainer[TaskInputType]
    granularities: _containers.RepeatedScalarFieldContainer[TaskOutputGranularity]
    encodings: _containers.RepeatedScalarFieldContainer[EmbeddingEncoding]
    dimension: int
    max_batch_size: int
    max_output_values_per_item: int
    supports_priority: bool
    supports_lora: bool
    supports_normalization: bool
    supports_dimension_override: bool
    modalities: _containers.RepeatedScalarFieldContainer[_input_pb2.Modality]
    def __init__(self, supported: _Optional[bool] = ..., input_types: _Optional[_Iterable[_Union[TaskInputType, str]]] = ..., granularities: _Optional[_Iterable[_Union[TaskOutputGranularity, str]]] = ..., encodings: _Optional[_Iterable[_Union[EmbeddingEncoding, str]]] = ..., dimension: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_output_values_per_item: _Optional[int] = ..., supports_priority: _Optional[bool] = ..., supports_lora: _Optional[bool] = ..., supports_normalization: _Optional[bool] = ..., supports_dimension_override: _Optional[bool] = ..., modalities: _Optional[_Iterable[_Union[_input_pb2.Modality, str]]] = ...) -> None: ...

class ClassifyCapabilities(_message.Message):
    __slots__ = ("supported", "input_types", "granularities", "semantics", "max_batch_size", "max_output_values_per_item", "supports_priority", "supports_lora", "modalities")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    GRANULARITIES_FIELD_NUMBER: _ClassVar[int]
    SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_VALUES_PER_ITEM_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_LORA_FIELD_NUMBER: _ClassVar[int]
    MODALITIES_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    input_types: _containers.RepeatedScalarFieldContainer[TaskInputType]
    granularities: _containers.RepeatedScalarFieldContainer[TaskOutputGranularity]
    semantics: _containers.RepeatedScalarFieldContainer[TaskValueSemantics]
    max_batch_size: int
    max_output_values_per_item: int
    supports_priority: bool
    supports_lora: bool
    modalities: _containers.RepeatedScalarFieldContainer[_input_pb2.Modality]
    def __init__(self, supported: _Optional[bool] = ..., input_types: _Optional[_Iterable[_Union[TaskInputType, str]]] = ..., granularities: _Optional[_Iterable[_Union[TaskOutputGranularity, str]]] = ..., semantics: _Optional[_Iterable[_Union[TaskValueSemantics, str]]] = ..., max_batch_size: _Optional[int] = ..., max_output_values_per_item: _Optional[int] = ..., supports_priority: _Optional[bool] = ..., supports_lora: _Optional[bool] = ..., modalities: _Optional[_Iterable[_Union[_input_pb2.Modality, str]]] = ...) -> None: ...

class ScoreCapabilities(_message.Message):
    __slots__ = ("supported", "input_types", "granularities", "semantics", "normalizations", "supports_label_token_scoring", "supports_instruction", "max_groups", "max_candidates_per_group", "max_output_values_per_candidate", "supports_priority", "supports_lora", "higher_is_better", "modalities", "max_label_token_ids")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    GRANULARITIES_FIELD_NUMBER: _ClassVar[int]
    SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATIONS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_LABEL_TOKEN_SCORING_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_PER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_VALUES_PER_CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_LORA_FIELD_NUMBER: _ClassVar[int]
    HIGHER_IS_BETTER_FIELD_NUMBER: _ClassVar[int]
    MODALITIES_FIELD_NUMBER: _ClassVar[int]
    MAX_LABEL_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    input_types: _containers.RepeatedScalarFieldContainer[TaskInputType]
    granularities: _containers.RepeatedScalarFieldContainer[TaskOutputGranularity]
    semantics: _containers.RepeatedScalarFieldContainer[TaskValueSemantics]
    normalizations: _containers.RepeatedScalarFieldContainer[ScoreNormalization]
    supports_label_token_scoring: bool
    supports_instruction: bool
    max_groups: int
    max_candidates_per_group: int
    max_output_values_per_candidate: int
    supports_priority: bool
    supports_lora: bool
    higher_is_better: bool
    modalities: _containers.RepeatedScalarFieldContainer[_input_pb2.Modality]
    max_label_token_ids: int
    def __init__(self, supported: _Optional[bool] = ..., input_types: _Optional[_Iterable[_Union[TaskInputType, str]]] = ..., granularities: _Optional[_Iterable[_Union[TaskOutputGranularity, str]]] = ..., semantics: _Optional[_Iterable[_Union[TaskValueSemantics, str]]] = ..., normalizations: _Optional[_Iterable[_Union[ScoreNormalization, str]]] = ..., supports_label_token_scoring: _Optional[bool] = ..., supports_instruction: _Optional[bool] = ..., max_groups: _Optional[int] = ..., max_candidates_per_group: _Optional[int] = ..., max_output_values_per_candidate: _Optional[int] = ..., supports_priority: _Optional[bool] = ..., supports_lora: _Optional[bool] = ..., higher_is_better: _Optional[bool] = ..., modalities: _Optional[_Iterable[_Union[_input_pb2.Modality, str]]] = ..., max_label_token_ids: _Optional[int] = ...) -> None: ...
