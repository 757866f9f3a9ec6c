"""The dtypes of a trace: how Kineto spells them, torch's names for them, their sizes."""

# The trace's dtype spellings -> torch's names: record_param_comms' ``dtype`` is c10's
# ScalarType name (c10/core/ScalarType.h), ``Input type`` the C++ type record_shapes prints.
TORCH_DTYPE = {
    "Float": "float32",
    "float": "float32",
    "Double": "float64",
    "double": "float64",
    "Half": "float16",
    "c10::Half": "float16",
    "BFloat16": "bfloat16",
    "c10::BFloat16": "bfloat16",
    "Long": "int64",
    "long int": "int64",
    "long": "int64",
    "Int": "int32",
    "int": "int32",
    "Short": "int16",
    "short int": "int16",
    "short": "int16",
    "Char": "int8",
    "signed char": "int8",
    "Byte": "uint8",
    "unsigned char": "uint8",
    "Bool": "bool",
    "bool": "bool",
    "Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "c10::Float8_e5m2": "float8_e5m2",
}
ITEM_BYTES = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
# Bytes per element for the dtype spellings of record_shapes ("Input type") and of
# record_param_comms ("dtype"), from the two tables above.
DTYPE_BYTES = {spelled: ITEM_BYTES[name] for spelled, name in TORCH_DTYPE.items()}
