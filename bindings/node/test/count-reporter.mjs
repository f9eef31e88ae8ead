// A node:test reporter that prints one closing line, `node: N passed, M
// failed` (`, K skipped` when some were), for scripts/test-node.sh. Whether
// the run passed is node's exit code, not this line.
export default async function* count(source) {
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  for await (const event of source) {
    if (event.data?.details?.type === 'suite') continue;
    if (event.type === 'test:pass') {
      if (event.data.skip || event.data.todo) skipped++;
      else passed++;
    } else if (event.type === 'test:fail') {
      failed++;
    }
  }
  yield `node: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}\n`;
}
