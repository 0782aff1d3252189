// The JSON Schema and documents of grammar_bench's mask figures, shared with the llama.cpp side of the
// comparison (bench/peers/llama_grammar.cpp).
#pragma once
#include <string>
#include <vector>

namespace grammar_bench {

inline const char* const kSchema = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 1000000},
    "name": {"type": "string", "maxLength": 64},
    "email": {"type": "string", "format": "email"},
    "created": {"type": "string", "format": "date-time"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 8},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "geo": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"]}},
      "required": ["street", "city"]},
    "orders": {"type": "array", "maxItems": 16, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
        "status": {"enum": ["pending", "shipped", "delivered"]},
        "notes": {"type": ["string", "null"]}},
      "required": ["sku", "qty", "status"]}},
    "active": {"type": "boolean"}
  },
  "required": ["id", "name", "tags", "address", "orders"]
})";

inline const std::vector<std::string> kDocs = {
    R"({"id": 4211, "name": "Ada Lovelace", "email": "ada.king@example.org", "created": "2024-05-17T09:30:00Z", "tags": ["math", "poetry", "engines"], "address": {"street": "12 St James's Square", "city": "London", "geo": {"lat": 51.5074, "lon": -0.1278}}, "orders": [{"sku": "ENG-0001", "qty": 2, "status": "shipped", "notes": "Handle with care; the analytical engine is fragile."}, {"sku": "CRD-1843", "qty": 40, "status": "pending", "notes": null}], "active": true})",
    "{\n  \"id\": 7,\n  \"name\": \"Grace Hopper\",\n  \"tags\": [\"cobol\", \"navy\"],\n  \"address\": {\n    "
    "\"street\": \"1 Compiler Way\",\n    \"city\": \"Arlington\"\n  },\n  \"orders\": [\n    {\n      \"sku\": "
    "\"BUG-1947\",\n      \"qty\": 1,\n      \"status\": \"delivered\"\n    }\n  ]\n}",
    R"({"id": 99, "name": "Émile Zola — J'accuse", "tags": [], "address": {"street": "Rue de Bruxelles 21 bis", "city": "Paris", "geo": {"lat": 48.8826, "lon": 2.3322}}, "orders": [{"sku": "LIT-1898", "qty": 13, "status": "pending", "notes": "Première édition, 日本語の注記 included"}, {"sku": "NEW-0042", "qty": 5, "status": "shipped"}, {"sku": "OLD-0001", "qty": 99, "status": "delivered", "notes": "\"quoted\" and \\ escaped \u00e9"}], "active": false})",
};

}  // namespace grammar_bench
