package modules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/better-compute/compute/api"
)

// Reasons in the details of the envelope's invalid_argument errors about a body.
const (
	ReasonInvalidJSON  = "invalid_json"
	ReasonUnknownField = "unknown_field"
	ReasonWrongType    = "wrong_type"
)

func decodeStrict(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}") // an empty body is an empty input
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &api.Error{Code: api.CodeInvalidArgument, Message: "body has data after its JSON value",
			Details: map[string]any{"reason": ReasonInvalidJSON}}
	}
	return nil
}

func bodyError(err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return &api.Error{Code: api.CodeInvalidArgument,
			Message: fmt.Sprintf("body is not valid JSON (at byte %d): %v", syntax.Offset, syntax),
			Details: map[string]any{"reason": ReasonInvalidJSON}}
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return &api.Error{Code: api.CodeInvalidArgument,
				Message: fmt.Sprintf("body must be a JSON object, got %s", typ.Value),
				Details: map[string]any{"reason": ReasonInvalidJSON}}
		}
		return &api.Error{Code: api.CodeInvalidArgument,
			Message: fmt.Sprintf("%s: must be %s, got %s", field, jsonType(typ.Type.String()), typ.Value),
			Details: map[string]any{"reason": ReasonWrongType, "field": field}}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		quoted := strings.TrimPrefix(err.Error(), "json: unknown field ")
		field, uerr := strconv.Unquote(quoted) // encoding/json quotes the name with %q
		if uerr != nil {
			field = strings.Trim(quoted, `"`)
		}
		return &api.Error{Code: api.CodeInvalidArgument,
			Message: fmt.Sprintf("unknown field %q", field),
			Details: map[string]any{"reason": ReasonUnknownField, "field": field}}
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return &api.Error{Code: api.CodeInvalidArgument, Message: "body is not valid JSON: it ends too early",
			Details: map[string]any{"reason": ReasonInvalidJSON}}
	default:
		return &api.Error{Code: api.CodeInvalidArgument, Message: "body: " + err.Error(),
			Details: map[string]any{"reason": ReasonInvalidJSON}}
	}
}

func jsonType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string", goType == "*string":
		return "a string"
	case goType == "bool", goType == "*bool":
		return "true or false"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "*map["):
		return "an object"
	default:
		return "a " + goType
	}
}
