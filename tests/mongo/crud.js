// The CRUD script of tests/mongo/README.md through mongosh 2.x (npm; its
// Node driver). Prints the canonical transcript, one JSON line per step, as
// crud.py and crud.c do; tests/mongo/run.sh diffs them.
//
//   mongosh --quiet --norc mongodb://HOST:PORT/DB tests/mongo/crud.js

// The transcript's form of a value (as crud.py's canon): keys sorted, an
// ObjectId as "ObjectId", numbers without their BSON type.
function canon(v) {
  if (v === null || v === undefined) return null;
  if (Array.isArray(v)) return v.map(canon);
  if (typeof v === 'number' || typeof v === 'string' || typeof v === 'boolean') return v;
  if (typeof v === 'bigint') return Number(v);
  if (typeof v === 'object') {
    switch (v._bsontype) {
      case 'ObjectId': return 'ObjectId';
      case 'Long': return Number(v.toString());
      case 'Int32': case 'Double': return v.valueOf();
      case undefined: break;
      default: return '<' + v._bsontype + '>';
    }
    if (v instanceof Date) return '<datetime>';
    const out = {};
    for (const k of Object.keys(v).sort()) out[k] = canon(v[k]);
    return out;
  }
  return '<' + typeof v + '>';
}

function emit(step, fields) {
  fields.step = step;
  print(JSON.stringify(canon(fields)));
}

function step(name, fn) {
  let fields;
  try {
    fields = fn();
  } catch (e) {
    fields = { unexpected_error: `${e.name}: ${e.message}` };
  }
  emit(name, fields);
}

// mongosh's UpdateResult names the upserted _id insertedId (the Node
// driver's, upsertedId).
function upd(r) {
  const id = r.upsertedId !== undefined ? r.upsertedId : r.insertedId;
  return { matched: r.matchedCount, modified: r.modifiedCount,
           upserted_id: id === undefined ? null : id };
}

const people = db.people, big = db.big;
people.drop();
big.drop();

const cities = ['Oslo', 'Lima', 'Pune', 'Kyiv'];
const tags = [['a', 'b'], ['b'], []];
const docs = [];
for (let i = 0; i < 20; i++)
  docs.push({ _id: i, name: 'p' + String(i).padStart(2, '0'), age: 20 + (i * 7) % 30,
              city: cities[i % 4], tags: tags[i % 3], score: i / 2 });
step('insert_many', () => ({ n: Object.keys(people.insertMany(docs).insertedIds).length }));
step('insert_noid', () => {
  const r = db.runCommand({ insert: 'people', documents: [
    { name: 'noid', age: 60, city: 'Oslo', tags: ['z'], score: 0.25 }] });
  return { reply: { n: r.n, ok: r.ok } };
});
step('find_noid', () => ({ doc: people.findOne({ name: 'noid' }) }));
step('find', () => ({ docs: people.find({ age: { $gte: 30 }, city: { $in: ['Oslo', 'Lima'] } },
                                        { name: 1, age: 1, _id: 0 })
  .sort({ age: -1, name: 1 }).limit(4).toArray() }));
step('find_array', () => ({ docs: people.find({ tags: 'b' }, { tags: 0, score: 0 })
  .sort({ _id: 1 }).skip(1).limit(3).toArray() }));
step('find_one_missing', () => ({ doc: people.findOne({ name: 'nobody' }) }));

step('insert_big', () => {
  const b = [];
  for (let i = 0; i < 10000; i++) b.push({ _id: i, v: i % 97, pad: 'x'.repeat(100) });
  return { n: Object.keys(big.insertMany(b).insertedIds).length };
});
step('cursor', () => {
  let n = 0, first = null, last = null, ordered = true, sumV = 0, prev = -1;
  const c = big.find({}).sort({ _id: 1 }).batchSize(500);
  while (c.hasNext()) {
    const d = c.next();
    const id = Number(canon(d._id));
    if (first === null) first = id;
    last = id;
    ordered = ordered && id > prev;
    prev = id;
    sumV += Number(canon(d.v));
    n++;
  }
  return { n: n, first: first, last: last, ordered: ordered, sum_v: sumV };
});
step('cursor_filter', () => ({ n: big.find({ v: { $lt: 10 } }).itcount() }));

step('update_many', () => upd(people.updateMany(
  { city: 'Oslo' }, { $inc: { age: 1 }, $set: { visited: true } })));
step('upsert_many', () => upd(people.updateMany(
  { name: 'zed' }, { $set: { age: 99 }, $setOnInsert: { city: 'Nowhere' } }, { upsert: true })));
step('upsert_id', () => upd(people.updateMany(
  { _id: 100 }, { $set: { name: 'hundred', age: 50 } }, { upsert: true })));
step('upsert_again', () => upd(people.updateMany(
  { name: 'zed' }, { $set: { age: 98 } }, { upsert: true })));
step('find_upserted', () => ({ docs: people.find({ age: { $gte: 50 } },
                                                 { _id: 0, name: 1, age: 1, city: 1, visited: 1 })
  .sort({ name: 1 }).toArray() }));

step('delete_one', () => ({ n: people.deleteOne({ name: 'p03' }).deletedCount }));
step('delete_many', () => ({ n: people.deleteMany({ age: { $lt: 25 } }).deletedCount }));
step('delete_none', () => ({ n: people.deleteMany({ name: 'nobody' }).deletedCount }));

step('count', () => ({ all: people.countDocuments({}),
                       lima: people.countDocuments({ city: 'Lima' }),
                       none: people.countDocuments({ city: 'Atlantis' }),
                       skip_limit: people.countDocuments({}, { skip: 2, limit: 5 }),
                       big: big.countDocuments({}) }));

step('create_index', () => ({ name: people.createIndex({ name: 1 }, { unique: true }) }));
step('list_indexes', () => ({ indexes: people.getIndexes().map((ix) => {
  const o = {};
  for (const k of ['key', 'name', 'unique']) if (k in ix) o[k] = ix[k];
  return o;
}).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)) }));

function dup(fn) {
  try {
    fn();
    return { code: null };
  } catch (e) {
    if (e.code === undefined) throw e;
    return { code: e.code };
  }
}
function dupMany(batch, ordered) {
  try {
    people.insertMany(batch, { ordered: ordered });
    return { code: null };
  } catch (e) {
    if (e.writeErrors === undefined) throw e;
    const errs = [].concat(e.writeErrors);
    return { code: errs[0].code, index: errs[0].index, errors: errs.length,
             inserted: e.insertedCount !== undefined ? e.insertedCount : e.result.insertedCount };
  }
}
step('dup_one', () => dup(() => people.insertOne({ _id: 200, name: 'p01' })));
step('dup_id', () => dup(() => people.insertOne({ _id: 1, name: 'other' })));
step('dup_many', () => dupMany(
  [{ _id: 300, name: 'q1' }, { _id: 301, name: 'p02' }, { _id: 302, name: 'q3' }], true));
step('dup_unordered', () => dupMany([{ _id: 303, name: 'p04' }, { _id: 304, name: 'q4' }], false));
step('count_after', () => ({ all: people.countDocuments({}) }));

step('aggregate', () => ({ docs: people.aggregate([
  { $match: { age: { $gte: 20 } } },
  { $group: { _id: '$city', n: { $sum: 1 }, avg_age: { $avg: '$age' },
              min_age: { $min: '$age' }, max_age: { $max: '$age' } } },
  { $sort: { _id: 1 } }]).toArray() }));
step('aggregate_big', () => ({ docs: big.aggregate([
  { $group: { _id: null, n: { $sum: 1 }, total: { $sum: '$v' } } }]).toArray() }));
