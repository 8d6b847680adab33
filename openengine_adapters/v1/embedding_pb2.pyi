from openengine_adapters.v1 import tasks_pb2 as _tasks_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EmbedRequest(_message.Message):
    __slots__ = ("context", "inputs", "options")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    context: _tasks_pb2.TaskRequestContext
    inputs: _containers.RepeatedCompositeFieldContainer[_tasks_pb2.TaskInput]
    options: EmbedOptions
    def __init__(self, context: _Optional[_Union[_tasks_pb2.TaskRequestContext, _Mapping]] = ..., inputs: _Optional[_Iterable[_Union[_tasks_pb2.TaskInput, _Mapping]]] = ..., options: _Optional[_Union[EmbedOptions, _Mapping]] = ...) -> None: ...

class EmbedOptions(_message.Message):
    __slots__ = ("granularity", "normalize", "dimensions", "encoding")
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    granularity: _tasks_pb2.TaskOutputGranularity
    normalize: bool
    dimensions: int
    encoding: _tasks_pb2.EmbeddingEncoding
    def __init__(self, granularity: _Optional[_Union[_tasks_pb2.TaskOutputGranularity, str]] = ..., normalize: _Optional[bool] = ..., dimensions: _Optional[int] = ..., encoding: _Optional[_Union[_tasks_pb2.EmbeddingEncoding, str]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("request_id", "outputs", "usage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    outputs: _containers.RepeatedCompositeFieldContainer[EmbeddingOutput]
    usage: _tasks_pb2.TaskUsage
    def __init__(self, request_id: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[EmbeddingOutput, _Mapping]]] = ..., usage: _Optional[_Union[_tasks_pb2.TaskUsage, _Mapping]] = ...) -> None: ...

class EmbeddingOutput(_message.Message):
    __slots__ = ("item_id", "input_index", "granularity", "dense", "sparse", "token_ids")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    input_index: int
    granularity: _tasks_pb2.TaskOutputGranularity
    dense: _tasks_pb2.DenseFloatTensor
    sparse: _tasks_pb2.SparseFloatTensor
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, item_id: _Optional[str] = ..., input_index: _Optional[int] = ..., granularity: _Optional[_Union[_tasks_pb2.TaskOutputGranularity, str]] = ..., dense: _Optional[_Union[_tasks_pb2.DenseFloatTensor, _Mapping]] = ..., sparse: _Optional[_Union[_tasks_pb2.SparseFloatTensor, _Mapping]] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...
