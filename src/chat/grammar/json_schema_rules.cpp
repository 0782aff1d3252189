#include "chat/grammar/json_schema_rules.h"

namespace cera::grammar {

const std::map<std::string, std::string> kPrimitives = {
    {"ws", R"(( " " | "\n" [ \t]{0,16} )?)"},
    // One character of a JSON string: a surrogate pair's two escapes are one character (a string's length
    // counts them once, as JSON Schema does), and a lone surrogate is none.
    {"char",
     R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2} ) ))"},
    {"string", R"("\"" char* "\"")"},
    {"integer", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))"},
    {"number", R"("-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?)"},
    {"boolean", R"("true" | "false")"},
    {"null", R"("null")"},
    {"value", R"(object | array | string | number | boolean | null)"},
    {"object", R"("{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* ws )? "}")"},
    {"array", R"("[" ws ( value ( ws "," ws value )* ws )? "]")"},
    {"hex", R"([0-9a-fA-F])"},
    {"date",
     R"([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))"},
    {"time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
    {"uuid", R"(hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12})"},
    {"email-atom", R"([a-zA-Z0-9_+-]{1,32})"},
    {"email-label", R"([a-zA-Z0-9] ( [a-zA-Z0-9-]{0,20} [a-zA-Z0-9] )?)"},
    {"email", R"(email-atom ( "." email-atom ){0,3} "@" email-label ( "." email-label ){1,3})"},
    {"ipv4-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])"},
    {"ipv4", R"(ipv4-octet "." ipv4-octet "." ipv4-octet "." ipv4-octet)"},
    {"hostname-label", R"([a-zA-Z0-9] ( [a-zA-Z0-9-]{0,38} [a-zA-Z0-9] )?)"},
    {"hostname", R"(hostname-label ( "." hostname-label ){0,4})"},
    // RFC 4291's text forms as RFC 3986 writes them: eight groups, "::" for a run of zero groups, the last
    // two groups as an IPv4 address.
    {"ipv6-full", R"(hex{1,4} ( ":" hex{1,4} ){7})"},
    {"ipv6-h16", R"(hex{1,4})"},
    {"ipv6-ls32", R"(ipv6-h16 ":" ipv6-h16 | ipv4)"},
    {"ipv6",
     R"(( ipv6-h16 ":" ){6} ipv6-ls32 | "::" ( ipv6-h16 ":" ){5} ipv6-ls32 | ipv6-h16? "::" ( ipv6-h16 ":" ){4} ipv6-ls32 | ( ( ipv6-h16 ":" ){0,1} ipv6-h16 )? "::" ( ipv6-h16 ":" ){3} ipv6-ls32 | ( ( ipv6-h16 ":" ){0,2} ipv6-h16 )? "::" ( ipv6-h16 ":" ){2} ipv6-ls32 | ( ( ipv6-h16 ":" ){0,3} ipv6-h16 )? "::" ipv6-h16 ":" ipv6-ls32 | ( ( ipv6-h16 ":" ){0,4} ipv6-h16 )? "::" ipv6-ls32 | ( ( ipv6-h16 ":" ){0,5} ipv6-h16 )? "::" ipv6-h16 | ( ( ipv6-h16 ":" ){0,6} ipv6-h16 )? "::")"},
    {"duration-num", R"([0-9]{1,9})"},
    {"duration-time",
     R"("T" ( duration-num "H" ( duration-num "M" )? ( duration-num "S" )? | duration-num "M" ( duration-num "S" )? | duration-num "S" ))"},
    {"duration",
     R"("P" ( duration-num "Y" ( duration-num "M" )? ( duration-num "D" )? duration-time? | duration-num "M" ( duration-num "D" )? duration-time? | duration-num "D" duration-time? | duration-time | duration-num "W" ))"},
    {"uri-pchar", R"([a-zA-Z0-9._~!$&'()*+,;=:@-] | "%" hex hex)"},
    {"uri-qchar", R"(uri-pchar | [/?])"},
    {"uri",
     R"([a-zA-Z] [a-zA-Z0-9+.-]{0,15} ":" ( "//" hostname ( ":" [0-9]{1,5} )? ( "/" uri-pchar{0,32} ){0,6} | uri-pchar{1,32} ( "/" uri-pchar{0,32} ){0,5} ) ( "?" uri-qchar{0,128} )? ( "#" uri-qchar{0,64} )?)"},
    // A relative reference (RFC 3986): a network path, an absolute path, a path whose first segment has no
    // colon (else it would read as a scheme), or none, then the query and fragment.
    {"uri-ncchar", R"([a-zA-Z0-9._~!$&'()*+,;=@-] | "%" hex hex)"},
    {"uri-relative",
     R"(( "//" hostname ( ":" [0-9]{1,5} )? ( "/" uri-pchar{0,32} ){0,6} | "/" ( uri-pchar{1,32} ( "/" uri-pchar{0,32} ){0,5} )? | uri-ncchar{1,32} ( "/" uri-pchar{0,32} ){0,5} )? ( "?" uri-qchar{0,128} )? ( "#" uri-qchar{0,64} )?)"},
    {"uri-reference", R"(uri | uri-relative)"},
    // RFC 6901, segments of printable ASCII ("~0" for "~", "~1" for "/"; no quote, backslash or brackets).
    {"json-pointer-segment", R"(( [ !#-.0-Z^-}] | "~" [01] ){0,32})"},
    {"json-pointer", R"(( "/" json-pointer-segment ){0,8})"},
    {"relative-json-pointer", R"(( "0" | [1-9] [0-9]{0,3} ) ( "#" | json-pointer ))"},
};
const std::map<std::string, std::vector<std::string>> kPrimitiveDeps = {
    {"string", {"char"}},
    {"value", {"object", "array", "string", "number", "boolean", "null"}},
    {"object", {"ws", "string", "value"}},
    {"array", {"ws", "value"}},
    {"uuid", {"hex"}},
    {"email", {"email-atom", "email-label"}},
    {"ipv4", {"ipv4-octet"}},
    {"hostname", {"hostname-label"}},
    {"uri-pchar", {"hex"}},
    {"uri-qchar", {"uri-pchar"}},
    {"uri", {"hostname", "uri-pchar", "uri-qchar"}},
    {"uri-ncchar", {"hex"}},
    {"uri-relative", {"hostname", "uri-pchar", "uri-qchar", "uri-ncchar"}},
    {"uri-reference", {"uri", "uri-relative"}},
    {"json-pointer", {"json-pointer-segment"}},
    {"relative-json-pointer", {"json-pointer"}},
    {"ipv6-full", {"hex"}},
    {"ipv6-h16", {"hex"}},
    {"ipv6-ls32", {"ipv6-h16", "ipv4"}},
    {"ipv6", {"ipv6-h16", "ipv6-ls32"}},
    {"duration-time", {"duration-num"}},
    {"duration", {"duration-num", "duration-time"}},
};

const std::vector<StringFormat> kFormats = {
    {"password", 0, -1},
    {"binary", 0, -1},
    {"date", 10, 10},
    {"time", 9, 21},
    {"date-time", 20, 32},
    {"uuid", 36, 36},
    {"email", 5, 223},
    {"uri", 3, 1389},
    {"ipv4", 7, 15},
    {"hostname", 1, 204},
    {"ipv6", 2, 45},
    {"duration", 3, 62},
    {"uri-reference", 0, 1389},
    {"json-pointer", 0, 520},
    {"relative-json-pointer", 1, 524},
};

}  // namespace cera::grammar
