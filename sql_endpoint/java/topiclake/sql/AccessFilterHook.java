package topiclake.sql;

import java.util.ArrayList;
import java.util.List;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.DefaultMetaStoreFilterHookImpl;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.NoSuchObjectException;
import org.apache.hadoop.hive.metastore.api.Table;

/**
 * hive.metastore.filter.hook: a JDBC user never sees a table it may not read, in SHOW TABLES, in the
 * driver's metadata calls (getTables, getColumns) or by name (it is "not found").
 */
public class AccessFilterHook extends DefaultMetaStoreFilterHookImpl {
  public AccessFilterHook(HiveConf conf) {
    super(conf);
  }

  @Override
  public List<String> filterTableNames(String database, List<String> names) throws MetaException {
    String user = Access.user();
    if (user == null) {
      return names;
    }
    List<String> out = new ArrayList<>();
    for (String n : names) {
      if (Access.canRead(user, database, n)) {
        out.add(n);
      }
    }
    return out;
  }

  @Override
  public Table filterTable(Table table) throws NoSuchObjectException {
    String user = Access.user();
    if (user != null && table != null && !Access.canRead(user, table.getDbName(), table.getTableName())) {
      throw new NoSuchObjectException(table.getDbName() + "." + table.getTableName() + " table not found");
    }
    return table;
  }

  @Override
  public List<Table> filterTables(List<Table> tables) throws MetaException {
    String user = Access.user();
    if (user == null) {
      return tables;
    }
    List<Table> out = new ArrayList<>();
    for (Table t : tables) {
      if (Access.canRead(user, t.getDbName(), t.getTableName())) {
        out.add(t);
      }
    }
    return out;
  }
}
