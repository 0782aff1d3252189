// Checks generated texts against JSON Schemas, independently of cera: JSON.parse for well-formedness,
// ajv (draft 2020-12, with ajv-formats in full mode) for the schema.
//   node validate.js CASES.json
// CASES.json: [{"name": ..., "schema": {...} or null (any JSON), "outputs": ["...", ...]}, ...]
// Prints one line per invalid output and a summary; exits 0 when every output is valid, 1 otherwise.
'use strict';
const fs = require('fs');
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats').default;

const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
// multipleOf is exact decimal arithmetic in JSON Schema; ajv divides doubles (3.30 / 0.05 =
// 65.99999999999999), so it compares the quotient to an integer to 9 decimals.
const ajv = new Ajv2020({strict: false, allErrors: true, multipleOfPrecision: 9});
addFormats(ajv, {mode: 'full'});
let total = 0, bad = 0;
for (const c of cases) {
    const validate = c.schema === null ? null : ajv.compile(c.schema);
    for (const text of c.outputs) {
        ++total;
        let value;
        try {
            value = JSON.parse(text);
        } catch (e) {
            ++bad;
            console.log(`${c.name}: not JSON (${e.message}): ${JSON.stringify(text)}`);
            continue;
        }
        if (validate && !validate(value)) {
            ++bad;
            console.log(`${c.name}: schema violation ${ajv.errorsText(validate.errors)}: ${JSON.stringify(text)}`);
        }
    }
}
console.log(`validated ${total} outputs, ${bad} invalid`);
process.exit(bad === 0 ? 0 : 1);
