from openengine_adapters.v1 import tasks_pb2 as _tasks_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("context", "groups", "options")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    context: _tasks_pb2.TaskRequestContext
    groups: _containers.RepeatedCompositeFieldContainer[ScoreGroup]
    options: ScoreOptions
    def __init__(self, context: _Optional[_Union[_tasks_pb2.TaskRequestContext, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[ScoreGroup, _Mapping]]] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ...) -> None: ...

class ScoreGroup(_message.Message):
    __slots__ = ("group_id", "query", "candidates")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    query: _tasks_pb2.TaskInput
    candidates: _containers.RepeatedCompositeFieldContainer[_tasks_pb2.TaskInput]
    def __init__(self, group_id: _Optional[str] = ..., query: _Optional[_Union[_tasks_pb2.TaskInput, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[_tasks_pb2.TaskInput, _Mapping]]] = ...) -> None: ...

class ScoreOptions(_message.Message):
    __slots__ = ("granularity", "output_semantics", "normalization", "label_token_ids", "instruction")
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    LABEL_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    granularity: _tasks_pb2.TaskOutputGranularity
    output_semantics: _tasks_pb2.TaskValueSemantics
    normalization: _tasks_pb2.ScoreNormalization
    label_token_ids: _containers.RepeatedScalarFieldContainer[int]
    instruction: str
    def __init__(self, granularity: _Optional[_Union[_tasks_pb2.TaskOutputGranularity, str]] = ..., output_semantics: _Optional[_Union[_tasks_pb2.TaskValueSemantics, str]] = ..., normalization: _Optional[_Union[_tasks_pb2.ScoreNormalization, str]] = ..., label_token_ids: _Optional[_Iterable[int]] = ..., instruction: _Optional[str] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("request_id", "groups", "granularity", "semantics", "higher_is_better", "normalization", "label_token_ids", "usage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    HIGHER_IS_BETTER_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    LABEL_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    groups: _containers.RepeatedCompositeFieldContainer[ScoreGroupOutput]
    granularity: _tasks_pb2.TaskOutputGranularity
    semantics: _tasks_pb2.TaskValueSemantics
    higher_is_better: bool
    normalization: _tasks_pb2.ScoreNormalization
    label_token_ids: _containers.RepeatedScalarFieldContainer[int]
    usage: _tasks_pb2.TaskUsage
    def __init__(self, request_id: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ScoreGroupOutput, _Mapping]]] = ..., granularity: _Optional[_Union[_tasks_pb2.TaskOutputGranularity, str]] = ..., semantics: _Optional[_Union[_tasks_pb2.TaskValueSemantics, str]] = ..., higher_is_better: _Optional[bool] = ..., normalization: _Optional[_Union[_tasks_pb2.ScoreNormalization, str]] = ..., label_token_ids: _Optional[_Iterable[int]] = ..., usage: _Optional[_Union[_tasks_pb2.TaskUsage, _Mapping]] = ...) -> None: ...

class ScoreGroupOutput(_message.Message):
    __slots__ = ("group_id", "group_index", "candidates")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    group_index: int
    candidates: _containers.RepeatedCompositeFieldContainer[ScoreCandidateOutput]
    def __init__(self, group_id: _Optional[str] = ..., group_index: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[ScoreCandidateOutput, _Mapping]]] = ...) -> None: ...

class ScoreCandidateOutput(_message.Message):
    __slots__ = ("candidate_id", "candidate_index", "scores", "token_ids")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    candidate_index: int
    scores: _tasks_pb2.DenseFloatTensor
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, candidate_id: _Optional[str] = ..., candidate_index: _Optional[int] = ..., scores: _Optional[_Union[_tasks_pb2.DenseFloatTensor, _Mapping]] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...
