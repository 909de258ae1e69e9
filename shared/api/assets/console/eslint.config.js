// ESLint's configuration for the operator console (run by tests/harness/console.sh).
'use strict';

const js = require('@eslint/js');
const globals = require('globals');

module.exports = [
  js.configs.recommended,
  {
    files: ['console.js'],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: 'script',
      // A browser script; outside a browser (its unit tests) it exports its helpers.
      globals: { ...globals.browser, module: 'writable' },
    },
    rules: {
      'no-unused-vars': ['error', { caughtErrors: 'none' }],
      eqeqeq: 'error',
      'no-implicit-globals': 'error',
      'no-eval': 'error',
      'no-implied-eval': 'error',
      'no-new-func': 'error',
      'no-script-url': 'error',
      strict: ['error', 'global'],
    },
  },
  {
    files: ['console.test.js', 'eslint.config.js'],
    languageOptions: { ecmaVersion: 2022, sourceType: 'commonjs', globals: globals.node },
  },
];
